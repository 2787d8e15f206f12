//! Writes the certificates the SDK suites use against a TLS idemd:
//! `cargo run --example test_certs -- DIR` (`make sdk-test` does it).
//!
//! Generated on the machine rather than committed, so no private key lives
//! in the repository. `make test-certs` writes them once per target
//! directory (`client-tenants.txt`, written last, marks a complete set):
//! rcgen's default validity runs to 4096, and suites running concurrently
//! never see the files change under them.
//!
//! Files written in `DIR`:
//!
//! | file | what |
//! |---|---|
//! | `ca.pem` | the CA that signed everything below (server and clients trust it) |
//! | `server.crt`, `server.key` | idemd's certificate for `localhost` and `127.0.0.1` |
//! | `alice.crt`, `alice.key` | a client certificate with the SPIFFE URI SAN [`ALICE_SPIFFE`] |
//! | `bob.crt`, `bob.key` | a client certificate with the DNS SAN [`BOB_DNS`] |
//! | `client-tenants.txt` | `--tls-client-tenants`: Alice's URI → tenant `alice`, Bob's name → tenant `bob` |

#[path = "../tests/common/certs.rs"]
mod certs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Alice's identity, mapped to tenant `alice`.
const ALICE_SPIFFE: &str = "spiffe://conformance.idemd/sa/alice";
/// Bob's identity, mapped to tenant `bob`.
const BOB_DNS: &str = "bob.conformance.idemd";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: test_certs DIR");
        return ExitCode::from(2);
    };
    match write_all(&PathBuf::from(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("test_certs: {error}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ca = certs::Ca::new("idemd conformance CA");
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text)
            .map_err(|error| std::io::Error::new(error.kind(), format!("{name}: {error}")))
    };
    write("ca.pem", &ca.pem)?;
    let (cert, key) = ca.server();
    write("server.crt", &cert)?;
    write("server.key", &key)?;
    let (cert, key) = ca.client_uri(ALICE_SPIFFE);
    write("alice.crt", &cert)?;
    write("alice.key", &key)?;
    let (cert, key) = ca.client_dns(BOB_DNS);
    write("bob.crt", &cert)?;
    write("bob.key", &key)?;
    write(
        "client-tenants.txt",
        &format!(
            "# SAN  TENANT  ROLE (written by examples/test_certs.rs)\n\
             {ALICE_SPIFFE}  alice  reconciler\n\
             {BOB_DNS}  bob  reconciler\n"
        ),
    )
}
