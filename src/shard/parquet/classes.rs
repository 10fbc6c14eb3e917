//! A dataset's class names, looked up by name: a string label costs one
//! hash lookup whatever the number of classes, and one lookup serves every
//! row group a dataset's streams read (built once, shared).

use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct ClassNames {
    count: usize,
    index: HashMap<String, i64>,
}

impl ClassNames {
    /// Label `i` is `names[i]`; a name listed twice is its first index.
    pub fn new(names: &[String]) -> Self {
        let mut index = HashMap::with_capacity(names.len());
        for (at, name) in names.iter().enumerate() {
            index.entry(name.clone()).or_insert(at as i64);
        }
        Self {
            count: names.len(),
            index,
        }
    }

    /// How many classes (0: the labels carry no names).
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn index_of(&self, name: &str) -> Option<i64> {
        self.index.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_its_first_index() {
        let names: Vec<String> = ["cat", "dog", "cat"].map(String::from).to_vec();
        let classes = ClassNames::new(&names);
        assert_eq!(classes.len(), 3);
        assert_eq!(classes.index_of("cat"), Some(0));
        assert_eq!(classes.index_of("dog"), Some(1));
        assert_eq!(classes.index_of("eel"), None);
        assert!(ClassNames::new(&[]).is_empty());
    }
}
