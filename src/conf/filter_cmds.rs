//! Handlers of the filter commands (3proxy.cfg(5) "PCRE FILTERING";
//! 3proxy's pcre.c `h_pcre`, `h_pcre_rewrite`, `h_pcre_extend`,
//! `h_pcre_options`, conf.c `h_filtermaxsize`). Later services snapshot
//! the chain (`State::filters`).

use super::state::State;
use super::value::number;
use crate::filter::Filter;

/// `pcre TYPE ACTION REGEXP [ACE]`.
pub fn h_pcre(state: &mut State, args: &[String]) -> Result<(), String> {
    let f = Filter::parse(
        &args[1],
        &args[2],
        &args[3],
        None,
        &args[4..],
        &state.pcre_opts,
    )?;
    state.filters.push(f);
    Ok(())
}

/// `pcre_rewrite TYPE ACTION REGEXP REWRITE [ACE]`.
pub fn h_pcre_rewrite(state: &mut State, args: &[String]) -> Result<(), String> {
    let f = Filter::parse(
        &args[1],
        &args[2],
        &args[3],
        Some(&args[4]),
        &args[5..],
        &state.pcre_opts,
    )?;
    state.filters.push(f);
    Ok(())
}

/// `pcre_extend ACTION [ACE]`.
pub fn h_pcre_extend(state: &mut State, args: &[String]) -> Result<(), String> {
    state.filters.extend(&args[1], &args[2..])
}

/// `pcre_options OPTION...`: replaces the options of later patterns.
pub fn h_pcre_options(state: &mut State, args: &[String]) -> Result<(), String> {
    let mut o = crate::filter::Options::default();
    for a in &args[1..] {
        o.set(a)?;
    }
    state.pcre_opts = o;
    Ok(())
}

/// `filtermaxsize N`: the most body bytes a filter holds (0: bodies are
/// not filtered).
pub fn h_filtermaxsize(state: &mut State, args: &[String]) -> Result<(), String> {
    state.filtermaxsize = number(&args[1], 0usize, 1 << 30)?;
    Ok(())
}
