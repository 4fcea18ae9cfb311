//! The `kvd` command. Until the server lands it opens a data directory, prints its status
//! and exits.
//!
//! Usage: `kvd [--data-dir DIR]` (default `./default.kvd`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut data_dir = String::from("default.kvd");
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--data-dir", Some(dir)) => data_dir = dir,
            _ => {
                eprintln!("usage: kvd [--data-dir DIR]");
                return ExitCode::from(2);
            }
        }
    }
    match run(&data_dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(data_dir: &str) -> kvd::Result<()> {
    let engine = kvd::Engine::open(data_dir, kvd::Config::default())?;
    let status = engine.status()?;
    println!(
        "{{\"data_dir\":\"{data_dir}\",\"revision\":{},\"compact_revision\":{},\"db_size\":{},\"db_size_in_use\":{},\"applied_index\":{}}}",
        status.header.revision,
        status.compact_revision,
        status.db_size,
        status.db_size_in_use,
        status.applied_index
    );
    engine.close()
}
