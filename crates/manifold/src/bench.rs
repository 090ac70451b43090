//! Benchmarks. They report figures; they assert nothing.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {}
}
