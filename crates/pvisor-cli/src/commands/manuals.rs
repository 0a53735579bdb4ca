//! `pvisor completions SHELL` and `pvisor man`: shell completion scripts and
//! man pages generated from the same clap definitions as `--help`, so they
//! cannot drift from the binary.

use std::io::Write;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManArgs};

pub fn cmd_completions(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "pvisor", &mut std::io::stdout());
    Ok(0)
}

pub fn cmd_man(args: ManArgs) -> anyhow::Result<i32> {
    let command = Cli::command();
    let Some(dir) = args.dir else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(command).render(&mut out).context("cannot write the man page")?;
        out.flush()?;
        return Ok(0);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = 0;
    let mut pages = vec![("pvisor".to_owned(), command.clone())];
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("pvisor-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut bytes = Vec::new();
        clap_mangen::Man::new(page).render(&mut bytes).context("cannot render a man page")?;
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    println!("wrote {written} man pages to {}", crate::output::shown_path(&dir));
    Ok(0)
}
