//! A driver whose version is outside the table is refused at start, with the versions this
//! build supports (issue 29, item 1). The driver here answers the version check over a real
//! socket with real escape frames, as the simulated driver does, and reports a version no
//! release has; nothing after the check is answered, so the backend must stop there.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use openimex_driver::{Backend, DriverError, open};
use openimex_rmabi::escape::{NV_ESC_CHECK_VERSION_STR, nv_ioctl_rm_api_version_t};
use openimex_simproto::escape::{EscapeReply, decode_call, encode_reply};
use openimex_simproto::frame::send_frame;
use openimex_simproto::proto::recv_body;
use zerocopy::{FromBytes, IntoBytes};

fn root() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("openimex-driver-version-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    dir
}

#[test]
fn an_unknown_driver_version_is_refused_naming_the_supported_ones() {
    let root = root();
    let listener = UnixListener::bind(root.join("dev/nvidiactl")).unwrap();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        let mut calls = Vec::new();
        let mut body = Vec::new();
        // Answer until the client hangs up; count what it asked.
        while let Ok(fds) = recv_body(&sock, &mut body) {
            let call = decode_call(&body, fds).unwrap();
            calls.push(call.nr);
            let mut v = nv_ioctl_rm_api_version_t::read_from_bytes(&call.arg).unwrap();
            assert_eq!(
                call.nr, NV_ESC_CHECK_VERSION_STR,
                "only the version check may come"
            );
            v.reply = 1;
            let errno = if v.cmd == u32::from(b'2') {
                v.versionString = [0; 64];
                v.versionString[..7].copy_from_slice(b"999.1.0");
                0
            } else if v.version() == "999.1.0" {
                0
            } else {
                22
            };
            let mut out = Vec::new();
            encode_reply(
                &mut out,
                call.nr,
                &EscapeReply {
                    errno,
                    arg: v.as_bytes().to_vec(),
                    params: Vec::new(),
                },
            );
            send_frame(&sock, &out, &[]).unwrap();
        }
        calls
    });
    let err = open(&Backend::Nvidia(root.clone())).err().expect("refused");
    let text = err.to_string();
    assert!(matches!(err, DriverError::Unavailable { .. }), "{err:?}");
    assert!(text.contains("999.1.0"), "{text}");
    assert!(
        text.contains("595.45.04") && text.contains("550.40.07"),
        "the supported versions: {text}"
    );
    let calls = server.join().unwrap();
    assert!(!calls.is_empty() && calls.iter().all(|&nr| nr == NV_ESC_CHECK_VERSION_STR));
    std::fs::remove_dir_all(&root).unwrap();
}
