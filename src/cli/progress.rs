//! Progress bars of the long commands (`pack`, `warm`, `index`). Drawn on
//! stderr when it is a terminal; hidden when it is a pipe or a file (CI logs,
//! Python's `shardfeed.pack()` under a notebook), where only the summary
//! line on stdout is wanted.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over bytes whose total is not known yet, with `what` before it
/// and the rate and ETA after; [`ProgressBar::set_message`] adds what else
/// the command counts. It stays undrawn until [`set_total`] gives it a
/// total above zero: drawn at once it would show "100% 0 B/0 B".
pub fn bytes(what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    styled(bar, BYTES, what)
}

/// Sets `bar`'s total and position; the first total above zero starts
/// drawing it (on stderr, when that is a terminal).
pub fn set_total(bar: &ProgressBar, done: u64, total: u64) {
    let first = bar.length() == Some(0) && total > 0;
    bar.set_length(total);
    bar.set_position(done);
    if first {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
}

/// A count without a known end (samples streamed), with its rate.
pub fn count(what: &str) -> ProgressBar {
    styled(ProgressBar::no_length(), COUNT, what)
}

const BYTES: &str = "{prefix} [{bar:30}] {percent:>3}% {bytes}/{total_bytes} \
                     {binary_bytes_per_sec} eta {eta}  {msg}";
const COUNT: &str = "{prefix} {spinner} {human_pos} ({per_sec})  {msg}";

fn styled(bar: ProgressBar, template: &str, what: &str) -> ProgressBar {
    // A template is fixed at build time; a bad one falls back to the plain
    // style rather than failing the command it only decorates.
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.");
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_without_a_total_is_not_drawn() {
        let bar = bytes("test");
        assert!(bar.is_hidden());
        set_total(&bar, 0, 0);
        assert!(bar.is_hidden(), "drawn before its total was known");
        set_total(&bar, 5, 10);
        assert_eq!((bar.position(), bar.length()), (5, Some(10)));
    }

    #[test]
    fn the_templates_parse() {
        for template in [BYTES, COUNT] {
            if let Err(error) = ProgressStyle::with_template(template) {
                panic!("{template}: {error}");
            }
        }
    }
}
