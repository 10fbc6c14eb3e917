//! The table of ops applied after the crop: one row per op, in the order
//! each draws from a sample's generator and is applied to its output.
//!
//! A row names the op's type and the field it takes in [`Ops`] (a stream's
//! parameters) and [`Drawn`] (one sample's decisions). Everything that
//! handles ops (checks, draws, the output's last step, both wires) goes
//! through these two structs, so a new op is its own file in this folder,
//! its `mod` line and row here, its proto fields and its Python mirror.
//! Append rows: an op's place fixes what it draws, and a row inserted above
//! another would move that op's draws for every sample.

mod flip;

pub use flip::{flip_rows, HorizontalFlip};

use super::op::{AugmentError, Op};
use crate::plan::rng::Rng;
use crate::proto::v1 as pb;

/// Sets one op in a stream's [`Ops`] (see [`Ops::with`]).
pub trait Slot: Op {
    fn set(self, ops: &mut Ops);
}

macro_rules! ops_table {
    ($($(#[doc = $doc:literal])* $name:ident: $op:ty,)+) => {
        /// A stream's ops after the crop, each off by default.
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct Ops {
            $($(#[doc = $doc])* pub $name: $op,)+
        }

        /// What each op decided for one sample.
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct Drawn {
            $(pub $name: <$op as Op>::Drawn,)+
        }

        $(impl Slot for $op {
            fn set(self, ops: &mut Ops) {
                ops.$name = self;
            }
        })+

        impl Ops {
            /// Every op off (usable in a `const`, with `..Ops::NONE`).
            pub const NONE: Ops = Ops {
                $($name: <$op as Op>::OFF,)+
            };

            pub fn validate(&self) -> Result<(), AugmentError> {
                $(self.$name.validate()?;)+
                Ok(())
            }

            pub fn is_random(&self) -> bool {
                false $(|| self.$name.is_random())+
            }

            /// Each op's decision, drawn in table order (a struct
            /// expression evaluates its fields in the order written).
            pub fn draw(&self, rng: &mut Rng) -> Drawn {
                Drawn {
                    $($name: self.$name.draw(rng),)+
                }
            }

            pub fn from_wire(wire: &pb::Augmentation) -> Self {
                Self {
                    $($name: <$op as Op>::from_wire(wire),)+
                }
            }

            pub fn to_wire(&self, wire: &mut pb::Augmentation) {
                $(self.$name.to_wire(wire);)+
            }
        }

        impl Drawn {
            /// Applies each decision, in table order, to one output of
            /// `width` pixels per row.
            pub fn apply(&self, width: u32, out: &mut [u8]) {
                $(<$op as Op>::apply(self.$name, width, out);)+
            }

            pub fn from_wire(wire: &pb::CropBox) -> Self {
                Self {
                    $($name: <$op as Op>::drawn_from_wire(wire),)+
                }
            }

            pub fn to_wire(&self, wire: &mut pb::CropBox) {
                $(<$op as Op>::drawn_to_wire(self.$name, wire);)+
            }
        }
    };
}

ops_table! {
    /// Mirrors left to right (`augmentation.horizontal_flip`).
    horizontal_flip: flip::HorizontalFlip,
}

impl Ops {
    /// These ops with `op` set.
    pub fn with(mut self, op: impl Slot) -> Self {
        op.set(&mut self);
        self
    }
}
