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

use std::collections::{BTreeSet, HashMap};

use super::format::ShardKind;
use super::index::{check_shard_name, ShardEntry, ShardIndex, INDEX_DIR, INDEX_VERSION};
use super::manifest::ManifestEntry;
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

/// Whether a key has a hidden segment (`.git/`, `.ipynb_checkpoints/`,
/// `._x.jpg`): left out, as `pack` leaves hidden files out.
fn is_hidden(relative: &str) -> bool {
    relative.split('/').any(|segment| segment.starts_with('.'))
}

/// The images of a listing under `prefix`, labelled by class folder.
///
/// Returns the objects and the class names (label `i` is `classes[i]`).
/// Images directly under the prefix have no class: label -1.
pub fn from_class_folders(objects: &[ObjectMeta], prefix: &str) -> (Vec<LooseObject>, Vec<String>) {
    let images: Vec<(&ObjectMeta, &str)> = objects
        .iter()
        .filter_map(|o| Some((o, o.key.strip_prefix(prefix)?)))
        .filter(|(_, rel)| !rel.starts_with(INDEX_DIR) && !is_hidden(rel) && is_image_key(rel))
        .filter(|(_, rel)| check_shard_name(rel).is_ok())
        .collect();
    // Every folder is a class, images or not (a folder marker `cat/`, or a
    // folder of other files): a class without images must not shift the rest.
    let classes: Vec<String> = objects
        .iter()
        .filter_map(|o| o.key.strip_prefix(prefix))
        .filter(|rel| !rel.starts_with(INDEX_DIR) && !is_hidden(rel))
        .filter_map(|rel| rel.split_once('/').map(|(class, _)| class))
        .filter(|class| check_shard_name(class).is_ok())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(str::to_string)
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

/// Classes of a class-folder listing that hold no image.
pub fn empty_classes<'a>(objects: &[LooseObject], classes: &'a [String]) -> Vec<&'a str> {
    let used: BTreeSet<i64> = objects.iter().map(|o| o.label).collect();
    classes
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(&(*i as i64)))
        .map(|(_, c)| c.as_str())
        .collect()
}

/// The manifest's entries with their sizes and ETags from the listing of
/// its folder; every listed key must exist.
pub fn from_manifest(
    entries: Vec<ManifestEntry>,
    objects: &[ObjectMeta],
    prefix: &str,
) -> Result<Vec<LooseObject>, String> {
    let listed: HashMap<&str, &ObjectMeta> = objects
        .iter()
        .filter_map(|o| Some((o.key.strip_prefix(prefix)?, o)))
        .collect();
    let mut missing = Vec::new();
    let mut loose = Vec::with_capacity(entries.len());
    for entry in entries {
        match listed.get(entry.path.as_str()) {
            Some(object) => loose.push(LooseObject {
                key: entry.path,
                size: object.size,
                etag: object.etag.clone(),
                label: entry.label,
            }),
            None => missing.push(entry.path),
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
        let mut digest = Vec::new();
        // A member without a version leaves the group without one: its
        // digest could not tell a changed object from the one before.
        let versioned = members.iter().all(|object| object.etag.is_some());
        for object in members {
            digest.extend_from_slice(object.key.as_bytes());
            digest.push(0);
            digest.extend_from_slice(object.etag.as_deref().unwrap_or("").as_bytes());
            digest.push(0);
            digest.extend_from_slice(&object.label.to_le_bytes());
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
            kind: ShardKind::Objects {
                digest: versioned
                    .then(|| format!("{:016x}", crate::hash::fmix64(crate::hash::fnv1a(digest)))),
            },
        });
        indexes.push(index);
    }
    (entries, indexes)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

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
            meta("imgs/cow/", 0),
            meta("imgs/ant/readme.txt", 1),
            meta("imgs/.ipynb_checkpoints/x.jpg", 1),
            meta("imgs/cat/._1.jpg", 1),
        ];
        let (objects, classes) = from_class_folders(&listing, "imgs/");
        // Folders without images (a marker, other files) keep their indexes.
        assert_eq!(classes, ["ant", "cat", "cow", "dog", "zebra"]);
        assert_eq!(empty_classes(&objects, &classes), ["ant", "cow"]);
        let labels: Vec<_> = objects.iter().map(|o| (o.key.as_str(), o.label)).collect();
        assert_eq!(
            labels,
            [
                ("dog/2.JPG", 3),
                ("cat/1.jpg", 1),
                ("zebra/a/b.png", 4),
                ("top.webp", -1)
            ]
        );
    }

    #[test]
    fn manifest_keys_must_exist() {
        let listing = [meta("p/a.jpg", 1), meta("p/b.jpg", 2)];
        let entry = |path: &str, label| ManifestEntry {
            line: 1,
            path: path.into(),
            label,
        };
        let found = from_manifest(vec![entry("b.jpg", 4)], &listing, "p/").unwrap();
        assert_eq!((found[0].size, found[0].label), (2, 4));
        let error =
            from_manifest(vec![entry("a.jpg", 0), entry("c.jpg", 1)], &listing, "p/").unwrap_err();
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
