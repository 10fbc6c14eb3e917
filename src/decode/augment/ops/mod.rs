//! The table of ops applied after the crop: one row per op, in the order
//! each draws from a sample's generator and is applied to its output.
//!
//! A row names the op's type and the field it takes in [`Ops`] (a stream's
//! parameters) and [`Drawn`] (one sample's decisions). Everything that
//! handles ops (checks, draws, the output's last step, both wires) goes
//! through these two structs, so a new op is its own file in this folder,
//! its `mod` line and row here, its `OpWire` impl (`../wire/rows.rs`), its
//! proto fields and its Python mirror.
//! A row's place is the order ops apply in; what each draws is keyed by
//! its name (`Op::NAME`), not its place, so rows may be inserted. The
//! flip alone draws from the crop's generator (frozen since it shipped).
//! The pixel work is in `../kernels/`.

mod affine;
mod blur;
mod coin;
mod erasing;
mod flip;
mod group;
mod jitter;
mod photometric;
mod policy;
mod rotation;
mod timm;

pub use super::kernels::PilResample;
pub use affine::{AffineDrawn, RandomAffine};
pub use blur::GaussianBlur;
pub use coin::{
    Autocontrast, Coin, Equalize, Grayscale, Invert, Kernel, Posterize, RandomAdjustSharpness,
    RandomAutocontrast, RandomEqualize, RandomGrayscale, RandomInvert, RandomPosterize,
    RandomSolarize, RandomVerticalFlip, Sharpness, Solarize, VerticalFlip,
};
pub use erasing::{EraseValue, ErasedBox, RandomErasing};
pub(super) use erasing::{DEFAULT_RATIO as ERASE_RATIO, DEFAULT_SCALE as ERASE_SCALE};
pub use flip::{flip_rows, HorizontalFlip};
pub use group::{Applied, Group, GroupKind, Groups, MAX_GROUPS, MAX_GROUP_ROWS};
pub use jitter::{ColorJitter, JitterDrawn, JitterOp, MAX_STEPS as MAX_JITTER_STEPS};
pub use photometric::{PhotometricDrawn, RandomPhotometricDistort};
pub use policy::{
    AutoAugment, Fill, Policy, PolicyDrawn, PolicyOp, PolicyStep, DEFAULT_BINS, MAX_POLICY_OPS,
};
pub use rotation::RandomRotation;
pub use timm::{TimmDrawn, TimmOp, TimmRandAugment, TimmStep, MAX_TIMM_LAYERS, MAX_TIMM_OPS};

use super::op::{AugmentError, DrawAt, Op};
use crate::plan::rng::Rng;

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
            /// RandomApply / RandomChoice / RandomOrder over the rows
            /// (`augmentation.groups`); none: every row on runs.
            pub groups: Groups,
        }

        /// What each op decided for one sample.
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct Drawn {
            $(pub $name: <$op as Op>::Drawn,)+
            /// With groups: the rows that ran, in the order they ran
            /// (those a group skipped have their decision cleared).
            pub applied: Option<Applied>,
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
                groups: Groups::NONE,
            };

            /// The table's op names, in its order.
            pub const NAMES: &'static [&'static str] = &[$(<$op as Op>::NAME),+];

            /// Which rows this stream turns on, by table index.
            fn on(&self) -> [bool; group::MAX_ROWS] {
                let rows = [$(self.$name.is_random()),+];
                let mut on = [false; group::MAX_ROWS];
                on[..rows.len()].copy_from_slice(&rows);
                on
            }

            /// Applies row `row`'s decision (see [`Self::apply`]).
            fn apply_row(&self, row: usize, drawn: &Drawn, width: u32, out: &mut [u8]) {
                let mut index = 0usize;
                $(
                    if index == row {
                        self.$name.apply(&drawn.$name, width, out);
                    }
                    index += 1;
                )+
                debug_assert!(row < index);
            }

            /// Whether a client that decodes, applying the ops named in
            /// `client_ops`, applies every op this stream runs (else the
            /// server decodes all of its samples).
            pub fn client_replays(&self, client_ops: &[String]) -> bool {
                self.groups.is_empty() $(&& (!self.$name.is_random()
                    || <$op as Op>::CLIENT_REPLAYS
                    || client_ops.iter().any(|name| name == <$op as Op>::NAME)))+
            }

            pub fn validate(&self) -> Result<(), AugmentError> {
                $(self.$name.validate()?;)+
                self.groups.validate(&self.on()[..Self::NAMES.len()], Self::NAMES)
            }

            pub fn is_random(&self) -> bool {
                false $(|| self.$name.is_random())+
            }

            /// Each op's decision, drawn in table order (a struct
            /// expression evaluates its fields in the order written), then
            /// the groups' (which rows run, in which order).
            pub fn draw(&self, sample: &mut Rng, at: &DrawAt) -> Drawn {
                let mut drawn = Drawn {
                    $($name: self.$name.draw(sample, at),)+
                    applied: None,
                };
                if !self.groups.is_empty() {
                    let on = self.on();
                    let applied = self.groups.draw(&on[..Self::NAMES.len()], at);
                    for row in (0..Self::NAMES.len()).filter(|&row| on[row]) {
                        if !applied.rows().any(|ran| ran == row) {
                            drawn.clear_row(row);
                        }
                    }
                    drawn.applied = Some(applied);
                }
                drawn
            }

            /// Applies each decision to one output of `width` pixels per
            /// row: in table order, or as the sample's groups drew it.
            pub fn apply(&self, drawn: &Drawn, width: u32, out: &mut [u8]) {
                match &drawn.applied {
                    None => {
                        $(self.$name.apply(&drawn.$name, width, out);)+
                    }
                    Some(applied) => {
                        for row in applied.rows() {
                            self.apply_row(row, drawn, width, out);
                        }
                    }
                }
            }
        }

        impl Drawn {
            /// Row `row`'s decision as a sample that did not draw it.
            fn clear_row(&mut self, row: usize) {
                let mut index = 0usize;
                $(
                    if index == row {
                        self.$name = Default::default();
                    }
                    index += 1;
                )+
                debug_assert!(row < index);
            }
        }

        // The per-sample order holds every row.
        const _: () = assert!(Ops::NAMES.len() <= group::MAX_ROWS);
    };
}

/// The table's rows, handed to `$callback!`: the table itself
/// (`ops_table!`) and the wire's rows (`wire/spec.rs`) are built from this
/// one list.
macro_rules! op_table_rows {
    ($callback:ident) => {
        $callback! {
            /// Mirrors left to right (`augmentation.horizontal_flip`).
            horizontal_flip: HorizontalFlip,
            /// RandomVerticalFlip (`augmentation.vertical_flip`).
            vertical_flip: RandomVerticalFlip,
            /// RandomRotation (`augmentation.rotation`): the geometric ops come
            /// before the policy, as recipes write them.
            rotation: RandomRotation,
            /// RandomAffine (`augmentation.affine`).
            affine: RandomAffine,
            /// TrivialAugmentWide, RandAugment or AutoAugment
            /// (`augmentation.auto_augment`).
            auto_augment: AutoAugment,
            /// timm's RandAugment with PIL's kernels
            /// (`augmentation.timm_rand_augment`), at the policies' place.
            timm_rand_augment: TimmRandAugment,
            /// ColorJitter (`augmentation.color_jitter`).
            color_jitter: ColorJitter,
            /// RandomPhotometricDistort (`augmentation.photometric_distort`).
            photometric_distort: RandomPhotometricDistort,
            /// RandomGrayscale (`augmentation.grayscale`).
            grayscale: RandomGrayscale,
            /// GaussianBlur (`augmentation.gaussian_blur`), as the self-supervised
            /// recipes place it, after the colour ops.
            gaussian_blur: GaussianBlur,
            /// RandomSolarize (`augmentation.solarize`).
            solarize: RandomSolarize,
            /// The other single-op colour transforms, each its own coin
            /// (`augmentation.sharpness`, `.posterize`, `.equalize`,
            /// `.autocontrast`, `.invert`), in the order of their field numbers.
            sharpness: RandomAdjustSharpness,
            posterize: RandomPosterize,
            equalize: RandomEqualize,
            autocontrast: RandomAutocontrast,
            invert: RandomInvert,
            /// RandomErasing (`augmentation.random_erasing`), last as the recipes
            /// apply it after Normalize.
            random_erasing: RandomErasing,
        }
    };
}
pub(crate) use op_table_rows;

op_table_rows!(ops_table);

impl Ops {
    /// These ops with `op` set.
    pub fn with(mut self, op: impl Slot) -> Self {
        op.set(&mut self);
        self
    }
}
