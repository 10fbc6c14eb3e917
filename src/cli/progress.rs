//! Progress bars of the long commands (`pack`, `warm`, `index`). Drawn on
//! stderr when it is a terminal; hidden when it is a pipe or a file (CI logs,
//! Python's `shardfeed.pack()` under a notebook), where only the summary
//! line on stdout is wanted.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `total` bytes, with `what` before it and the rate and ETA
/// after; [`ProgressBar::set_message`] adds what else the command counts.
pub fn bytes(total: u64, what: &str) -> ProgressBar {
    styled(ProgressBar::new(total), BYTES, what)
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
    fn the_templates_parse() {
        for template in [BYTES, COUNT] {
            if let Err(error) = ProgressStyle::with_template(template) {
                panic!("{template}: {error}");
            }
        }
    }
}
