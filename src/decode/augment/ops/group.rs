//! torchvision's containers over the table's rows: `RandomApply` of
//! several transforms (one coin for all), `RandomChoice` (one of them,
//! by weight) and `RandomOrder` (all of them, in an order drawn per
//! sample).
//!
//! A group names rows by their table index. Its rows must sit next to each
//! other among the rows a stream turns on, so that the group runs at one
//! place of the table, as the container runs at one place of the user's
//! Compose. Each group draws from its own key (its place in the request's
//! list), after every row has drawn its own decision; a row a group skips
//! keeps no decision (it is cleared), so a sample's report lists only what
//! ran. Rows draw whether or not a group later skips them: a row's
//! decision never depends on another's.

use super::super::key::uniform;
use super::super::op::{invalid, AugmentError, DrawAt};

/// At most this many groups per stream, each of at most this many rows:
/// bounds that keep a stream's ops a fixed-size value (`Copy`).
pub const MAX_GROUPS: usize = 4;
pub const MAX_GROUP_ROWS: usize = 8;

/// The largest table the per-sample order holds (the table has fewer rows;
/// `ops/mod.rs` checks it at compile time).
pub const MAX_ROWS: usize = 32;

/// Each group's key, by its place in the request (never rename one: it
/// would move every user's draws).
const KEYS: [&str; MAX_GROUPS] = ["group.0", "group.1", "group.2", "group.3"];

const FIELD: &str = "augmentation.groups";

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum GroupKind {
    /// `RandomApply(rows, p)`: all of the rows or none.
    #[default]
    Apply,
    /// `RandomChoice(rows, weights)`: exactly one.
    Choice,
    /// `RandomOrder(rows)`: all, in a drawn order.
    Order,
}

/// One container: its rows (table indices, as the request lists them) and
/// its probability or weights.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Group {
    pub kind: GroupKind,
    rows: [u8; MAX_GROUP_ROWS],
    len: u8,
    /// `Apply`'s probability.
    pub p: f64,
    /// `Choice`'s weight per row; all equal when the request names none.
    weights: [f64; MAX_GROUP_ROWS],
}

impl Group {
    /// A group over `rows` (table indices); `weights` only for a choice
    /// (empty: equal). Panics past the bounds: for code, not requests.
    pub fn new(kind: GroupKind, rows: &[usize], p: f64, weights: &[f64]) -> Self {
        assert!(rows.len() <= MAX_GROUP_ROWS && weights.len() <= rows.len());
        let mut group = Self {
            kind,
            len: rows.len() as u8,
            p,
            ..Self::default()
        };
        for (slot, &row) in group.rows.iter_mut().zip(rows) {
            *slot = row as u8;
        }
        for (index, slot) in group.weights[..rows.len()].iter_mut().enumerate() {
            *slot = weights.get(index).copied().unwrap_or(1.0);
        }
        group
    }

    pub fn rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows[..self.len as usize]
            .iter()
            .map(|&row| row as usize)
    }

    pub fn weights(&self) -> &[f64] {
        &self.weights[..self.len as usize]
    }

    /// Checks the group against the rows the stream turns on (`on`, by
    /// table index) and the table's names; `taken` holds the rows earlier
    /// groups named.
    fn validate(
        &self,
        place: usize,
        on: &[bool],
        names: &[&str],
        taken: &mut [bool; MAX_ROWS],
    ) -> Result<(), AugmentError> {
        let at = |message: String| invalid(FIELD, format!("group {place}: {message}"));
        if self.len == 0 {
            return Err(at("names no rows".into()));
        }
        for row in self.rows() {
            let name = names[row];
            if !on[row] {
                return Err(at(format!(
                    "row `{name}` is off in this request; a group holds rows the request turns on"
                )));
            }
            if name == "random_erasing" {
                return Err(at(
                    "`random_erasing` runs after the trainer's conversions, apart from the \
                     other rows, so no container can hold it with them"
                        .into(),
                ));
            }
            if std::mem::replace(&mut taken[row], true) {
                return Err(at(format!(
                    "row `{name}` is in two groups (or twice in one)"
                )));
            }
        }
        // The group runs at one place: no other row the request turns on
        // may sit between its rows in the table's order.
        let (first, last) = (
            self.rows().min().unwrap_or(0),
            self.rows().max().unwrap_or(0),
        );
        if let Some(between) = (first..=last).find(|&row| on[row] && !self.rows().any(|r| r == row))
        {
            return Err(at(format!(
                "row `{}` runs between its rows `{}` and `{}` in the table's order; a group's \
                 rows run at one place, so the row must come before or after the group",
                names[between], names[first], names[last]
            )));
        }
        match self.kind {
            GroupKind::Apply if !(0.0..=1.0).contains(&self.p) => Err(at(format!(
                "p must be a probability in [0, 1], not {}",
                self.p
            ))),
            GroupKind::Choice
                if self.weights().iter().any(|w| !w.is_finite() || *w < 0.0)
                    || self.weights().iter().sum::<f64>() <= 0.0 =>
            {
                Err(at(format!(
                    "weights must be finite, at least 0 and not all 0, not {:?}",
                    self.weights()
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A stream's groups (none: every row on runs, in the table's order).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Groups {
    groups: [Group; MAX_GROUPS],
    len: u8,
}

/// Which rows ran on one sample, in the order they ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    rows: [u8; MAX_ROWS],
    len: u8,
}

impl Applied {
    pub fn rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows[..self.len as usize]
            .iter()
            .map(|&row| row as usize)
    }

    fn push(&mut self, row: usize) {
        self.rows[self.len as usize] = row as u8;
        self.len += 1;
    }

    /// The rows a report names, by the table's `names` (unknown names are
    /// not this build's table: left out).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a String>, table: &[&str]) -> Self {
        let mut applied = Self {
            rows: [0; MAX_ROWS],
            len: 0,
        };
        for name in names {
            if let Some(row) = table.iter().position(|known| known == name) {
                if (applied.len as usize) < MAX_ROWS {
                    applied.push(row);
                }
            }
        }
        applied
    }
}

impl Groups {
    pub const NONE: Groups = Groups {
        groups: [Group {
            kind: GroupKind::Apply,
            rows: [0; MAX_GROUP_ROWS],
            len: 0,
            p: 0.0,
            weights: [0.0; MAX_GROUP_ROWS],
        }; MAX_GROUPS],
        len: 0,
    };

    /// These groups and `group` (panics past [`MAX_GROUPS`]: for code).
    pub fn with(mut self, group: Group) -> Self {
        self.groups[self.len as usize] = group;
        self.len += 1;
        self
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &Group> {
        self.groups[..self.len as usize].iter()
    }

    pub fn validate(&self, on: &[bool], names: &[&str]) -> Result<(), AugmentError> {
        let mut taken = [false; MAX_ROWS];
        for (place, group) in self.iter().enumerate() {
            group.validate(place, on, names, &mut taken)?;
        }
        Ok(())
    }

    /// One sample's rows in the order they run: the rows on, in the
    /// table's order, less those a group skipped, each `Order` group's
    /// rows shuffled in place. The groups' rows are next to each other
    /// among those on ([`Self::validate`]), so a group is one slice.
    pub fn draw(&self, on: &[bool], at: &DrawAt) -> Applied {
        let mut order = Applied {
            rows: [0; MAX_ROWS],
            len: 0,
        };
        (0..on.len())
            .filter(|&row| on[row])
            .for_each(|row| order.push(row));
        let mut skipped = [false; MAX_ROWS];
        for (group, key) in self.iter().zip(KEYS) {
            let mut rng = at.generator(key);
            match group.kind {
                GroupKind::Apply => {
                    // torchvision's RandomApply: skipped when rand >= p.
                    if uniform(&mut rng) >= group.p {
                        group.rows().for_each(|row| skipped[row] = true);
                    }
                }
                GroupKind::Choice => {
                    let total: f64 = group.weights().iter().sum();
                    let mut point = uniform(&mut rng) * total;
                    // The last row with weight takes what rounding leaves.
                    let last = group.weights().iter().rposition(|w| *w > 0.0);
                    let chosen = group
                        .weights()
                        .iter()
                        .position(|&weight| {
                            point -= weight;
                            weight > 0.0 && point < 0.0
                        })
                        .or(last)
                        .unwrap_or(0);
                    for (index, row) in group.rows().enumerate() {
                        skipped[row] = index != chosen;
                    }
                }
                GroupKind::Order => {
                    let start = order.rows().position(|row| group.rows().any(|r| r == row));
                    let start = start.unwrap_or(0);
                    let end = start + group.len as usize;
                    rng.shuffle(&mut order.rows[start..end.min(order.len as usize)]);
                }
            }
        }
        let mut applied = Applied {
            rows: [0; MAX_ROWS],
            len: 0,
        };
        order
            .rows()
            .filter(|&row| !skipped[row])
            .for_each(|row| applied.push(row));
        applied
    }
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;
