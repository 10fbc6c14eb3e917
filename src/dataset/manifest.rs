//! Manifests: CSV or JSON-lines files that name samples and their labels.
//! `shardfeed pack --manifest` reads them for local files, the server for
//! loose objects; both go through [`parse_manifest`], so a manifest means the
//! same thing to each.
//!
//! The rules, chosen so that a label never changes silently:
//! - CSV lines are `path,label`, the label after the last comma (paths may
//!   hold commas). The first line is a header when it has a header's shape:
//!   a path cell with no `.` or `/` (a column name, not a file) and a label
//!   cell that is not an integer (`path,label`, `file,class`, `key,target`).
//! - JSON lines are objects with `"path"` or `"key"` and an optional
//!   `"label"` (an integer or a class name; absent: -1, unlabelled). Other
//!   fields are ignored.
//! - Labels are all integers (kept as they are) or all class names (numbered
//!   in sorted byte order, like Python's `sorted()`); a manifest mixing the
//!   two is refused naming the first line that differs. An empty CSV label
//!   is refused: `-1` says "unlabelled".
//! - A path is relative to the manifest's folder, stays inside it and is
//!   listed once.

use std::collections::{BTreeSet, HashMap};

/// One sample a manifest lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// 1-based line number, for messages.
    pub line: usize,
    pub path: String,
    /// The integer label, the class name's index, or -1 (none given).
    pub label: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub entries: Vec<ManifestEntry>,
    /// Class names when the labels were names: label `i` is `classes[i]`.
    pub classes: Vec<String>,
}

/// Whether a dataset URI's last segment names a manifest (`*.csv`,
/// `*.jsonl`) rather than a folder.
pub fn is_manifest_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".csv") || lower.ends_with(".jsonl")
}

enum Cell {
    Integer(i64),
    Name(String),
    Missing,
}

impl Cell {
    fn kind(&self) -> Option<&'static str> {
        match self {
            Self::Integer(_) => Some("an integer"),
            Self::Name(_) => Some("a class name"),
            Self::Missing => None,
        }
    }

    fn shown(&self) -> String {
        match self {
            Self::Integer(n) => n.to_string(),
            Self::Name(name) => format!("{name:?}"),
            Self::Missing => "(none)".into(),
        }
    }
}

fn cell(text: &str) -> Cell {
    match text.parse::<i64>() {
        Ok(n) => Cell::Integer(n),
        Err(_) => Cell::Name(text.to_string()),
    }
}

/// Whether a first CSV line is a header rather than a sample.
fn is_header(path: &str, label: &str) -> bool {
    !path.is_empty() && !path.contains(['.', '/']) && label.parse::<i64>().is_err()
}

/// Parses a manifest named `name` (the extension picks CSV or JSON lines).
/// Errors begin with `line N:` where a line is at fault.
pub fn parse_manifest(name: &str, bytes: &[u8]) -> Result<Manifest, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let lower = name.to_ascii_lowercase();
    let json = lower.ends_with(".jsonl") || lower.ends_with(".json");
    let mut rows: Vec<(usize, String, Cell)> = Vec::new();
    let mut first_line = true;
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        let at = |message: String| format!("line {number}: {message}");
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let was_first = std::mem::replace(&mut first_line, false);
        let (path, label) = if json {
            json_row(line).map_err(at)?
        } else {
            let (path, label) = line
                .rsplit_once(',')
                .ok_or_else(|| at("expected `path,label`".into()))?;
            let (path, label) = (unquote(path), unquote(label));
            if was_first && is_header(path, label) {
                continue;
            }
            if label.is_empty() {
                return Err(at(format!(
                    "{path:?} has an empty label (write -1 for an unlabelled sample)"
                )));
            }
            (path.to_string(), cell(label))
        };
        rows.push((number, path, label));
    }
    if rows.is_empty() {
        return Err("lists no samples".into());
    }
    resolve(rows)
}

fn unquote(cell: &str) -> &str {
    let cell = cell.trim();
    cell.strip_prefix('"')
        .and_then(|c| c.strip_suffix('"'))
        .unwrap_or(cell)
}

fn json_row(line: &str) -> Result<(String, Cell), String> {
    let expected = "expected {\"path\": ..., \"label\": ...} (or \"key\" for the path)";
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("{e} ({expected})"))?;
    let object = value.as_object().ok_or_else(|| expected.to_string())?;
    let path = match (object.get("path"), object.get("key")) {
        (Some(serde_json::Value::String(p)), None) | (None, Some(serde_json::Value::String(p))) => {
            p.clone()
        }
        (Some(_), Some(_)) => return Err("gives both \"path\" and \"key\"".into()),
        _ => return Err(format!("no string \"path\" or \"key\" ({expected})")),
    };
    let label = match object.get("label") {
        None | Some(serde_json::Value::Null) => Cell::Missing,
        Some(serde_json::Value::Number(n)) => match n.as_i64() {
            Some(n) => Cell::Integer(n),
            None => return Err(format!("label {n} is not an integer")),
        },
        Some(serde_json::Value::String(name)) if !name.is_empty() => cell(name),
        Some(other) => {
            return Err(format!(
                "label {other} is neither an integer nor a class name"
            ))
        }
    };
    Ok((path, label))
}

/// Checks paths and numbers the labels (see the module's rules).
fn resolve(rows: Vec<(usize, String, Cell)>) -> Result<Manifest, String> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(rows.len());
    let mut kind: Option<(usize, &Cell)> = None;
    for (line, path, label) in &rows {
        let at = |message: String| format!("line {line}: {message}");
        super::index::check_shard_name(path).map_err(|e| at(format!("path {e}")))?;
        if let Some(first) = seen.insert(path.as_str(), *line) {
            return Err(at(format!(
                "{path:?} is listed twice (first on line {first})"
            )));
        }
        match (kind, label.kind()) {
            (None, Some(_)) => kind = Some((*line, label)),
            (Some((first_line, first)), Some(this)) if first.kind() != Some(this) => {
                return Err(at(format!(
                    "label {} is {this}, but line {first_line}'s label {} is {}: labels \
                     must be all integers or all class names",
                    label.shown(),
                    first.shown(),
                    first.kind().unwrap_or_default()
                )));
            }
            _ => {}
        }
    }
    let classes: Vec<String> = rows
        .iter()
        .filter_map(|(_, _, label)| match label {
            Cell::Name(name) => Some(name.clone()),
            _ => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let numbers: HashMap<&str, i64> = classes
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), i as i64))
        .collect();
    let entries = rows
        .iter()
        .map(|(line, path, label)| ManifestEntry {
            line: *line,
            path: path.clone(),
            label: match label {
                Cell::Integer(n) => *n,
                Cell::Name(name) => numbers[name.as_str()],
                Cell::Missing => -1,
            },
        })
        .collect();
    Ok(Manifest { entries, classes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(name: &str, text: &str) -> Vec<(String, i64)> {
        parse_manifest(name, text.as_bytes())
            .unwrap()
            .entries
            .into_iter()
            .map(|e| (e.path, e.label))
            .collect()
    }

    #[test]
    fn headers_are_told_by_their_shape() {
        for header in [
            "path,label",
            "file,label",
            "filename,class",
            "key,target",
            "\"f\",\"y\"",
        ] {
            let text = format!("{header}\na.jpg,10\nb.jpg,2\n");
            assert_eq!(
                labels("m.csv", &text),
                [("a.jpg".to_string(), 10), ("b.jpg".to_string(), 2)],
                "{header}"
            );
        }
        // A first line that is a sample stays a sample.
        assert_eq!(labels("m.csv", "a.jpg,cat\n").len(), 1);
        assert_eq!(labels("m.csv", "a,3\n"), [("a".to_string(), 3)]);
    }

    #[test]
    fn integer_labels_stay_integers_past_ten_classes() {
        let text: String = (0..48).map(|i| format!("{i}.jpg,{}\n", i % 12)).collect();
        let parsed = parse_manifest("m.csv", format!("file,label\n{text}").as_bytes()).unwrap();
        assert!(parsed.classes.is_empty());
        for (i, entry) in parsed.entries.iter().enumerate() {
            assert_eq!(entry.label, (i % 12) as i64);
        }
    }

    #[test]
    fn class_names_are_numbered_in_sorted_order() {
        let parsed = parse_manifest("m.csv", b"x.jpg,dog\ny.jpg,cat\nz.jpg,Zebra\n").unwrap();
        assert_eq!(parsed.classes, ["Zebra", "cat", "dog"]);
        let got: Vec<i64> = parsed.entries.iter().map(|e| e.label).collect();
        assert_eq!(got, [2, 1, 0]);
    }

    #[test]
    fn json_lines_take_path_or_key_and_an_optional_label() {
        let text =
            "{\"path\": \"a.jpg\", \"label\": 2, \"caption\": \"x\"}\n{\"key\": \"b.jpg\"}\n";
        assert_eq!(
            labels("m.jsonl", text),
            [("a.jpg".to_string(), 2), ("b.jpg".to_string(), -1)]
        );
        let parsed = parse_manifest("m.JSONL", b"{\"key\":\"a.jpg\",\"label\":\"cat\"}\n").unwrap();
        assert_eq!(parsed.classes, ["cat"]);
    }

    #[test]
    fn bad_manifests_name_the_line() {
        let errors = [
            (
                "m.csv",
                "a.jpg,1\nb.jpg,cat\n",
                "line 2: label \"cat\" is a class name, but line 1",
            ),
            (
                "m.csv",
                "a.jpg,cat\nb.jpg,7\n",
                "line 2: label 7 is an integer, but line 1",
            ),
            (
                "m.csv",
                "file,label\na.jpg,1\nb.jpg,\n",
                "line 3: \"b.jpg\" has an empty label",
            ),
            (
                "m.csv",
                "a.jpg,1\na.jpg,2\n",
                "line 2: \"a.jpg\" is listed twice (first on line 1)",
            ),
            (
                "m.csv",
                "../up.jpg,1\n",
                "line 1: path shard name \"../up.jpg\"",
            ),
            ("m.csv", "x.jpg\n", "line 1: expected `path,label`"),
            (
                "m.jsonl",
                "{\"name\": \"x\"}\n",
                "line 1: no string \"path\" or \"key\"",
            ),
            (
                "m.jsonl",
                "{\"key\": \"x\", \"label\": 1.5}\n",
                "line 1: label 1.5 is not",
            ),
            ("m.csv", "\n", "lists no samples"),
            ("m.csv", "file,label\n", "lists no samples"),
        ];
        for (name, text, wanted) in errors {
            let error = parse_manifest(name, text.as_bytes()).unwrap_err();
            assert!(error.starts_with(wanted), "{error:?} lacks {wanted:?}");
        }
    }
}
