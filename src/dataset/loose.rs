//! Loose-object datasets: a prefix of individual images, each object one
//! sample and one GET.
//!
//! The listing is the index. Labels come from class folders (the first path
//! segment under the prefix, numbered in sorted order like torchvision's
//! ImageFolder) or from a manifest object listing keys and labels. The
//! objects are grouped into virtual shards of [`OBJECTS_PER_GROUP`] so the
//! plan, partitioning, resume and prefetch work on them exactly as on tar
//! shards. Groups are cut from a frozen pseudo-random permutation of the
//! listing, not from its sorted order: sorted keys run class by class, and a
//! group of one class would defeat the plan's interleave and shuffle buffer.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Deserialize;

use super::{check_shard_name, ShardEntry, ShardIndex, INDEX_DIR, INDEX_VERSION};
use crate::plan::rng::Rng;
use crate::shard::ImageFormat;
use crate::store::ObjectMeta;

/// Objects per virtual shard: the plan's unit of interleave, prefetch and
/// cache hints. Small enough that a rank of a small dataset still gets several.
pub const OBJECTS_PER_GROUP: usize = 1024;
/// Manifests are read whole; beyond this they are refused.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// Purpose tag of the grouping permutation (frozen: changing it reorders
/// every loose dataset's index).
const GROUPING: u64 = 0x4C4F_4F53_4547_5250; // "LOOSEGRP"

/// One object of a loose dataset, its key relative to the dataset prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LooseObject {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
    pub label: i64,
}

/// Whether a listed key names an image a class-folder dataset serves.
pub fn is_image_key(key: &str) -> bool {
    key.rsplit_once('.')
        .is_some_and(|(_, ext)| ImageFormat::from_extension(&ext.to_ascii_lowercase()).is_some())
}

/// The images of a listing under `prefix`, labelled by class folder.
///
/// Returns the objects and the class names (label `i` is `classes[i]`).
/// Images directly under the prefix have no class: label -1.
pub fn from_class_folders(objects: &[ObjectMeta], prefix: &str) -> (Vec<LooseObject>, Vec<String>) {
    let images: Vec<(&ObjectMeta, &str)> = objects
        .iter()
        .filter_map(|o| Some((o, o.key.strip_prefix(prefix)?)))
        .filter(|(_, rel)| !rel.starts_with(INDEX_DIR) && is_image_key(rel))
        .filter(|(_, rel)| check_shard_name(rel).is_ok())
        .collect();
    let classes: Vec<String> = images
        .iter()
        .filter_map(|(_, rel)| rel.split_once('/').map(|(class, _)| class.to_string()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let numbers: HashMap<&str, i64> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i as i64))
        .collect();
    let loose = images
        .into_iter()
        .map(|(object, rel)| LooseObject {
            key: rel.to_string(),
            size: object.size,
            etag: object.etag.clone(),
            label: rel
                .split_once('/')
                .and_then(|(class, _)| numbers.get(class).copied())
                .unwrap_or(-1),
        })
        .collect();
    (loose, classes)
}

/// Whether a dataset URI's last segment names a manifest rather than a folder.
pub fn is_manifest_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".csv") || lower.ends_with(".jsonl")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestLine {
    key: String,
    #[serde(default = "no_label")]
    label: i64,
}

fn no_label() -> i64 {
    -1
}

/// The `(key, label)` entries of a manifest: CSV lines `key,label` (an
/// optional `key,label` header; the label after the last comma, so keys may
/// hold commas) or JSON lines `{"key": ..., "label": ...}` (label optional:
/// -1). Keys are relative to the manifest's folder. Errors name the line.
pub fn parse_manifest(name: &str, bytes: &[u8]) -> Result<Vec<(String, i64)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let jsonl = name.to_ascii_lowercase().ends_with(".jsonl");
    let mut entries = Vec::new();
    let mut seen = HashSet::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = |message: String| format!("line {}: {message}", number + 1);
        if line.is_empty() || (!jsonl && number == 0 && line.eq_ignore_ascii_case("key,label")) {
            continue;
        }
        let (key, label) = if jsonl {
            let parsed: ManifestLine = serde_json::from_str(line)
                .map_err(|e| at(format!("{e} (expected {{\"key\": ..., \"label\": ...}})")))?;
            (parsed.key, parsed.label)
        } else {
            let (key, label) = line
                .rsplit_once(',')
                .ok_or_else(|| at("expected `key,label`".into()))?;
            let label = label
                .trim()
                .parse::<i64>()
                .map_err(|_| at(format!("label {label:?} is not an integer")))?;
            (key.trim().to_string(), label)
        };
        check_shard_name(&key).map_err(at)?;
        if !seen.insert(key.clone()) {
            return Err(at(format!("key {key:?} is listed twice")));
        }
        entries.push((key, label));
    }
    if entries.is_empty() {
        return Err("lists no objects".into());
    }
    Ok(entries)
}

/// The manifest's entries with their sizes and ETags from the listing of
/// its folder; every listed key must exist.
pub fn from_manifest(
    entries: Vec<(String, i64)>,
    objects: &[ObjectMeta],
    prefix: &str,
) -> Result<Vec<LooseObject>, String> {
    let listed: HashMap<&str, &ObjectMeta> = objects
        .iter()
        .filter_map(|o| Some((o.key.strip_prefix(prefix)?, o)))
        .collect();
    let mut missing = Vec::new();
    let mut loose = Vec::with_capacity(entries.len());
    for (key, label) in entries {
        match listed.get(key.as_str()) {
            Some(object) => loose.push(LooseObject {
                key,
                size: object.size,
                etag: object.etag.clone(),
                label,
            }),
            None => missing.push(key),
        }
    }
    if !missing.is_empty() {
        let shown: Vec<_> = missing.iter().take(5).collect();
        return Err(format!(
            "{} listed objects do not exist (first: {shown:?})",
            missing.len()
        ));
    }
    Ok(loose)
}

/// The virtual shards of a loose dataset and their indexes: a frozen
/// permutation of the objects (sorted first, so the listing's order does not
/// matter) cut into groups of [`OBJECTS_PER_GROUP`]. A sample's byte range
/// is its place in the group's concatenated objects.
pub fn group(mut objects: Vec<LooseObject>) -> (Vec<ShardEntry>, Vec<ShardIndex>) {
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    Rng::derive(&[GROUPING, objects.len() as u64]).shuffle(&mut objects);
    let mut entries = Vec::new();
    let mut indexes = Vec::new();
    for (number, members) in objects.chunks(OBJECTS_PER_GROUP).enumerate() {
        let mut index = ShardIndex {
            version: INDEX_VERSION,
            ..ShardIndex::default()
        };
        let mut offset = 0;
        for object in members {
            index.keys.push(object.key.clone());
            index.starts.push(offset);
            offset += object.size;
            index.ends.push(offset);
            index.labels.push(object.label);
            index.etags.push(object.etag.clone());
        }
        entries.push(ShardEntry {
            name: format!("objects-{number:06}"),
            size: offset,
            etag: None,
            samples: members.len() as u64,
        });
        indexes.push(index);
    }
    (entries, indexes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str, size: u64) -> ObjectMeta {
        ObjectMeta {
            key: key.into(),
            size,
            etag: Some(format!("\"{key}\"")),
        }
    }

    #[test]
    fn class_folders_number_classes_in_sorted_order() {
        let listing = [
            meta("imgs/_shardfeed/index.json", 1),
            meta("imgs/dog/2.JPG", 3),
            meta("imgs/cat/1.jpg", 2),
            meta("imgs/cat/notes.txt", 9),
            meta("imgs/zebra/a/b.png", 4),
            meta("imgs/top.webp", 5),
        ];
        let (objects, classes) = from_class_folders(&listing, "imgs/");
        assert_eq!(classes, ["cat", "dog", "zebra"]);
        let labels: Vec<_> = objects.iter().map(|o| (o.key.as_str(), o.label)).collect();
        assert_eq!(
            labels,
            [
                ("dog/2.JPG", 1),
                ("cat/1.jpg", 0),
                ("zebra/a/b.png", 2),
                ("top.webp", -1)
            ]
        );
    }

    #[test]
    fn manifests_parse_csv_and_json_lines_and_name_bad_lines() {
        let csv = b"key,label\na/1.jpg,3\n\nb,c.jpg, 7\n";
        assert_eq!(
            parse_manifest("m.csv", csv).unwrap(),
            [("a/1.jpg".to_string(), 3), ("b,c.jpg".to_string(), 7)]
        );
        let jsonl = b"{\"key\": \"x.jpg\", \"label\": 2}\n{\"key\": \"y.jpg\"}\n";
        assert_eq!(
            parse_manifest("m.JSONL", jsonl).unwrap(),
            [("x.jpg".to_string(), 2), ("y.jpg".to_string(), -1)]
        );
        let errors = [
            ("m.csv", &b"a.jpg,cat\n"[..], "line 1: label \"cat\""),
            (
                "m.csv",
                b"a.jpg,1\na.jpg,2\n",
                "line 2: key \"a.jpg\" is listed twice",
            ),
            (
                "m.csv",
                b"../up.jpg,1\n",
                "line 1: shard name \"../up.jpg\"",
            ),
            ("m.csv", b"x.jpg\n", "line 1: expected `key,label`"),
            ("m.jsonl", b"{\"path\": \"x\"}\n", "line 1: unknown field"),
            ("m.csv", b"\n", "lists no objects"),
        ];
        for (name, text, wanted) in errors {
            let error = parse_manifest(name, text).unwrap_err();
            assert!(error.starts_with(wanted), "{error:?} lacks {wanted:?}");
        }
    }

    #[test]
    fn manifest_keys_must_exist() {
        let listing = [meta("p/a.jpg", 1), meta("p/b.jpg", 2)];
        let found = from_manifest(vec![("b.jpg".into(), 4)], &listing, "p/").unwrap();
        assert_eq!((found[0].size, found[0].label), (2, 4));
        let error = from_manifest(
            vec![("a.jpg".into(), 0), ("c.jpg".into(), 1)],
            &listing,
            "p/",
        )
        .unwrap_err();
        assert_eq!(error, "1 listed objects do not exist (first: [\"c.jpg\"])");
    }

    #[test]
    fn groups_mix_classes_and_ignore_listing_order() {
        let objects: Vec<LooseObject> = (0..3000)
            .map(|i| LooseObject {
                key: format!("{:02}/{i:05}.jpg", i / 300),
                size: 10 + i as u64 % 7,
                etag: None,
                label: (i / 300) as i64,
            })
            .collect();
        let mut reversed = objects.clone();
        reversed.reverse();
        let (entries, indexes) = group(objects);
        assert_eq!(
            group(reversed),
            (entries.clone(), indexes.clone()),
            "listing order matters"
        );
        assert_eq!(
            entries.iter().map(|e| e.samples).collect::<Vec<_>>(),
            [1024, 1024, 952]
        );
        for (entry, index) in entries.iter().zip(&indexes) {
            assert_eq!(index.ends.last().copied(), Some(entry.size));
            let classes: HashSet<_> = index.labels.iter().collect();
            assert_eq!(classes.len(), 10, "every group holds every class");
        }
        // The same objects always group the same way (frozen permutation).
        assert_eq!(indexes[0].keys[..2], ["01/00471.jpg", "05/01790.jpg"]);
    }
}
