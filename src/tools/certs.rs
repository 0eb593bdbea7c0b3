//! `openimex certs --nodes nodes_config.cfg --out DIR [--days N] [--force]`: a CA for the
//! domain and, per entry of the nodes file, a key and a certificate for both sides of a peer
//! connection (the generation is `openimex_certs`, which the lab's test clusters use too),
//! then the config.cfg lines that turn mutual TLS on with them.

use std::path::PathBuf;

use anyhow::{Result, bail};
use openimex_certs as certs;
use openimex_config::{NodeConfig, is_placeholder};

/// `openimex certs` arguments.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// The nodes file: one certificate per entry, named for the entry (IP or DNS name).
    #[arg(long, value_name = "FILE")]
    nodes: PathBuf,
    /// Directory for ca.pem, ca.key, `node<ID>.pem` and `node<ID>.key` (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Validity of the CA and the certificates, in days.
    #[arg(long, default_value_t = certs::DEFAULT_DAYS)]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// Makes the files and prints the config lines of each node.
pub(crate) fn run(args: &CertsArgs) -> Result<()> {
    if args.days == 0 {
        bail!("--days 0 would make certificates that are never valid; pass a number of days >= 1");
    }
    let nodes = NodeConfig::load(&args.nodes)?;
    let entries = nodes.hosts();
    if entries.is_empty() {
        bail!(
            "{} has no node entries; list the nodes' addresses or names, one a line",
            args.nodes.display()
        );
    }
    if let Some((id, entry)) = entries.iter().enumerate().find(|(_, e)| is_placeholder(e)) {
        bail!(
            "{}: entry of node {id} is the placeholder {entry}, which no certificate can name; \
             fill in every entry first",
            args.nodes.display()
        );
    }
    let out = std::path::absolute(&args.out)?;
    let (files, _) = certs::write_domain(&entries, &out, args.days, args.force)?;
    println!(
        "Wrote the CA ({}, key {}) and {} node certificates into {}, valid for {} days.",
        files.ca_cert.display(),
        files.ca_key.display(),
        files.nodes.len(),
        out.display(),
        args.days
    );
    println!(
        "Copy ca.pem and node<ID>.pem/.key to each node (keys stay mode 0600; ca.key stays \
         off the nodes), then put these lines in its config.cfg (with the paths you copied to):"
    );
    for (id, node) in files.nodes.iter().enumerate() {
        println!("\n# node {id} ({})", node.entry);
        for (key, value) in files.config_lines(id).unwrap_or_default() {
            println!("{key}={value}");
        }
    }
    Ok(())
}
