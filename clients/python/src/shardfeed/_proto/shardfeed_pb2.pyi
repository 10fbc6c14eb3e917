from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Partition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITION_DROP_LAST: _ClassVar[Partition]
    PARTITION_PAD: _ClassVar[Partition]

class ResizeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESIZE_MODE_CENTER_CROP: _ClassVar[ResizeMode]
    RESIZE_MODE_STRETCH: _ClassVar[ResizeMode]

class Delivery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_DECODED: _ClassVar[Delivery]
    DELIVERY_ENCODED: _ClassVar[Delivery]

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_INLINE: _ClassVar[Transport]
    TRANSPORT_SHARED_MEMORY: _ClassVar[Transport]

class OpGroupKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_GROUP_KIND_UNSPECIFIED: _ClassVar[OpGroupKind]
    OP_GROUP_KIND_APPLY: _ClassVar[OpGroupKind]
    OP_GROUP_KIND_CHOICE: _ClassVar[OpGroupKind]
    OP_GROUP_KIND_ORDER: _ClassVar[OpGroupKind]

class Interpolation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERPOLATION_NEAREST: _ClassVar[Interpolation]
    INTERPOLATION_BILINEAR: _ClassVar[Interpolation]
    INTERPOLATION_BICUBIC: _ClassVar[Interpolation]

class TimmOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMM_OP_UNSPECIFIED: _ClassVar[TimmOp]
    TIMM_OP_AUTO_CONTRAST: _ClassVar[TimmOp]
    TIMM_OP_EQUALIZE: _ClassVar[TimmOp]
    TIMM_OP_INVERT: _ClassVar[TimmOp]
    TIMM_OP_ROTATE: _ClassVar[TimmOp]
    TIMM_OP_POSTERIZE: _ClassVar[TimmOp]
    TIMM_OP_POSTERIZE_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_POSTERIZE_ORIGINAL: _ClassVar[TimmOp]
    TIMM_OP_SOLARIZE: _ClassVar[TimmOp]
    TIMM_OP_SOLARIZE_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_SOLARIZE_ADD: _ClassVar[TimmOp]
    TIMM_OP_COLOR: _ClassVar[TimmOp]
    TIMM_OP_COLOR_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_CONTRAST: _ClassVar[TimmOp]
    TIMM_OP_CONTRAST_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_BRIGHTNESS: _ClassVar[TimmOp]
    TIMM_OP_BRIGHTNESS_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_SHARPNESS: _ClassVar[TimmOp]
    TIMM_OP_SHARPNESS_INCREASING: _ClassVar[TimmOp]
    TIMM_OP_SHEAR_X: _ClassVar[TimmOp]
    TIMM_OP_SHEAR_Y: _ClassVar[TimmOp]
    TIMM_OP_TRANSLATE_X_REL: _ClassVar[TimmOp]
    TIMM_OP_TRANSLATE_Y_REL: _ClassVar[TimmOp]
    TIMM_OP_TRANSLATE_X: _ClassVar[TimmOp]
    TIMM_OP_TRANSLATE_Y: _ClassVar[TimmOp]

class PolicyOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_OP_IDENTITY: _ClassVar[PolicyOp]
    POLICY_OP_SHEAR_X: _ClassVar[PolicyOp]
    POLICY_OP_SHEAR_Y: _ClassVar[PolicyOp]
    POLICY_OP_TRANSLATE_X: _ClassVar[PolicyOp]
    POLICY_OP_TRANSLATE_Y: _ClassVar[PolicyOp]
    POLICY_OP_ROTATE: _ClassVar[PolicyOp]
    POLICY_OP_BRIGHTNESS: _ClassVar[PolicyOp]
    POLICY_OP_COLOR: _ClassVar[PolicyOp]
    POLICY_OP_CONTRAST: _ClassVar[PolicyOp]
    POLICY_OP_SHARPNESS: _ClassVar[PolicyOp]
    POLICY_OP_POSTERIZE: _ClassVar[PolicyOp]
    POLICY_OP_SOLARIZE: _ClassVar[PolicyOp]
    POLICY_OP_AUTO_CONTRAST: _ClassVar[PolicyOp]
    POLICY_OP_EQUALIZE: _ClassVar[PolicyOp]
    POLICY_OP_INVERT: _ClassVar[PolicyOp]

class JitterOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JITTER_OP_BRIGHTNESS: _ClassVar[JitterOp]
    JITTER_OP_CONTRAST: _ClassVar[JitterOp]
    JITTER_OP_SATURATION: _ClassVar[JitterOp]
    JITTER_OP_HUE: _ClassVar[JitterOp]

class SampleForm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_FORM_UNSPECIFIED: _ClassVar[SampleForm]
    SAMPLE_FORM_PIXELS: _ClassVar[SampleForm]
    SAMPLE_FORM_JPEG: _ClassVar[SampleForm]
PARTITION_DROP_LAST: Partition
PARTITION_PAD: Partition
RESIZE_MODE_CENTER_CROP: ResizeMode
RESIZE_MODE_STRETCH: ResizeMode
DELIVERY_DECODED: Delivery
DELIVERY_ENCODED: Delivery
TRANSPORT_INLINE: Transport
TRANSPORT_SHARED_MEMORY: Transport
OP_GROUP_KIND_UNSPECIFIED: OpGroupKind
OP_GROUP_KIND_APPLY: OpGroupKind
OP_GROUP_KIND_CHOICE: OpGroupKind
OP_GROUP_KIND_ORDER: OpGroupKind
INTERPOLATION_NEAREST: Interpolation
INTERPOLATION_BILINEAR: Interpolation
INTERPOLATION_BICUBIC: Interpolation
TIMM_OP_UNSPECIFIED: TimmOp
TIMM_OP_AUTO_CONTRAST: TimmOp
TIMM_OP_EQUALIZE: TimmOp
TIMM_OP_INVERT: TimmOp
TIMM_OP_ROTATE: TimmOp
TIMM_OP_POSTERIZE: TimmOp
TIMM_OP_POSTERIZE_INCREASING: TimmOp
TIMM_OP_POSTERIZE_ORIGINAL: TimmOp
TIMM_OP_SOLARIZE: TimmOp
TIMM_OP_SOLARIZE_INCREASING: TimmOp
TIMM_OP_SOLARIZE_ADD: TimmOp
TIMM_OP_COLOR: TimmOp
TIMM_OP_COLOR_INCREASING: TimmOp
TIMM_OP_CONTRAST: TimmOp
TIMM_OP_CONTRAST_INCREASING: TimmOp
TIMM_OP_BRIGHTNESS: TimmOp
TIMM_OP_BRIGHTNESS_INCREASING: TimmOp
TIMM_OP_SHARPNESS: TimmOp
TIMM_OP_SHARPNESS_INCREASING: TimmOp
TIMM_OP_SHEAR_X: TimmOp
TIMM_OP_SHEAR_Y: TimmOp
TIMM_OP_TRANSLATE_X_REL: TimmOp
TIMM_OP_TRANSLATE_Y_REL: TimmOp
TIMM_OP_TRANSLATE_X: TimmOp
TIMM_OP_TRANSLATE_Y: TimmOp
POLICY_OP_IDENTITY: PolicyOp
POLICY_OP_SHEAR_X: PolicyOp
POLICY_OP_SHEAR_Y: PolicyOp
POLICY_OP_TRANSLATE_X: PolicyOp
POLICY_OP_TRANSLATE_Y: PolicyOp
POLICY_OP_ROTATE: PolicyOp
POLICY_OP_BRIGHTNESS: PolicyOp
POLICY_OP_COLOR: PolicyOp
POLICY_OP_CONTRAST: PolicyOp
POLICY_OP_SHARPNESS: PolicyOp
POLICY_OP_POSTERIZE: PolicyOp
POLICY_OP_SOLARIZE: PolicyOp
POLICY_OP_AUTO_CONTRAST: PolicyOp
POLICY_OP_EQUALIZE: PolicyOp
POLICY_OP_INVERT: PolicyOp
JITTER_OP_BRIGHTNESS: JitterOp
JITTER_OP_CONTRAST: JitterOp
JITTER_OP_SATURATION: JitterOp
JITTER_OP_HUE: JitterOp
SAMPLE_FORM_UNSPECIFIED: SampleForm
SAMPLE_FORM_PIXELS: SampleForm
SAMPLE_FORM_JPEG: SampleForm

class StreamBatchesRequest(_message.Message):
    __slots__ = ("dataset", "seed", "epoch", "rank", "world_size", "batch_size", "height", "width", "start_batch", "shuffle", "partition", "resize", "shuffle_buffer", "interleave", "resume_from", "augmentation", "transport", "layout", "sources", "weight_changes", "decoded_source", "delivery", "server_decode_fraction", "tune_server_decode", "weights_from_step", "server_decode_search", "repeats", "client_ops", "views")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    START_BATCH_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_BUFFER_FIELD_NUMBER: _ClassVar[int]
    INTERLEAVE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    AUGMENTATION_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    DECODED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SERVER_DECODE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    TUNE_SERVER_DECODE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    SERVER_DECODE_SEARCH_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_OPS_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    seed: int
    epoch: int
    rank: int
    world_size: int
    batch_size: int
    height: int
    width: int
    start_batch: int
    shuffle: bool
    partition: Partition
    resize: ResizeMode
    shuffle_buffer: int
    interleave: int
    resume_from: EpochPosition
    augmentation: Augmentation
    transport: Transport
    layout: SampleLayout
    sources: _containers.RepeatedCompositeFieldContainer[MixSource]
    weight_changes: _containers.RepeatedCompositeFieldContainer[WeightChange]
    decoded_source: DecodedSource
    delivery: Delivery
    server_decode_fraction: float
    tune_server_decode: bool
    weights_from_step: int
    server_decode_search: ShareSearch
    repeats: int
    client_ops: _containers.RepeatedScalarFieldContainer[str]
    views: _containers.RepeatedCompositeFieldContainer[ViewGroup]
    def __init__(self, dataset: _Optional[str] = ..., seed: _Optional[int] = ..., epoch: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., batch_size: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., start_batch: _Optional[int] = ..., shuffle: _Optional[bool] = ..., partition: _Optional[_Union[Partition, str]] = ..., resize: _Optional[_Union[ResizeMode, str]] = ..., shuffle_buffer: _Optional[int] = ..., interleave: _Optional[int] = ..., resume_from: _Optional[_Union[EpochPosition, _Mapping]] = ..., augmentation: _Optional[_Union[Augmentation, _Mapping]] = ..., transport: _Optional[_Union[Transport, str]] = ..., layout: _Optional[_Union[SampleLayout, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[MixSource, _Mapping]]] = ..., weight_changes: _Optional[_Iterable[_Union[WeightChange, _Mapping]]] = ..., decoded_source: _Optional[_Union[DecodedSource, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, str]] = ..., server_decode_fraction: _Optional[float] = ..., tune_server_decode: _Optional[bool] = ..., weights_from_step: _Optional[int] = ..., server_decode_search: _Optional[_Union[ShareSearch, _Mapping]] = ..., repeats: _Optional[int] = ..., client_ops: _Optional[_Iterable[str]] = ..., views: _Optional[_Iterable[_Union[ViewGroup, _Mapping]]] = ...) -> None: ...

class ViewGroup(_message.Message):
    __slots__ = ("height", "width", "views", "count")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    views: _containers.RepeatedCompositeFieldContainer[Augmentation]
    count: int
    def __init__(self, height: _Optional[int] = ..., width: _Optional[int] = ..., views: _Optional[_Iterable[_Union[Augmentation, _Mapping]]] = ..., count: _Optional[int] = ...) -> None: ...

class ViewBatch(_message.Message):
    __slots__ = ("shape", "offset", "length", "crops", "augmentations")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CROPS_FIELD_NUMBER: _ClassVar[int]
    AUGMENTATIONS_FIELD_NUMBER: _ClassVar[int]
    shape: Shape
    offset: int
    length: int
    crops: _containers.RepeatedCompositeFieldContainer[CropBox]
    augmentations: _containers.RepeatedCompositeFieldContainer[Augmentation]
    def __init__(self, shape: _Optional[_Union[Shape, _Mapping]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., crops: _Optional[_Iterable[_Union[CropBox, _Mapping]]] = ..., augmentations: _Optional[_Iterable[_Union[Augmentation, _Mapping]]] = ...) -> None: ...

class ShareSearch(_message.Message):
    __slots__ = ("center", "step", "hold", "next_hold", "loop_id", "noise")
    CENTER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOLD_FIELD_NUMBER: _ClassVar[int]
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    center: float
    step: float
    hold: int
    next_hold: int
    loop_id: int
    noise: float
    def __init__(self, center: _Optional[float] = ..., step: _Optional[float] = ..., hold: _Optional[int] = ..., next_hold: _Optional[int] = ..., loop_id: _Optional[int] = ..., noise: _Optional[float] = ...) -> None: ...

class DecodedSource(_message.Message):
    __slots__ = ("shorter_side", "stored_from_epoch")
    SHORTER_SIDE_FIELD_NUMBER: _ClassVar[int]
    STORED_FROM_EPOCH_FIELD_NUMBER: _ClassVar[int]
    shorter_side: int
    stored_from_epoch: int
    def __init__(self, shorter_side: _Optional[int] = ..., stored_from_epoch: _Optional[int] = ...) -> None: ...

class MixSource(_message.Message):
    __slots__ = ("dataset", "weight", "layout")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    weight: float
    layout: SampleLayout
    def __init__(self, dataset: _Optional[str] = ..., weight: _Optional[float] = ..., layout: _Optional[_Union[SampleLayout, _Mapping]] = ...) -> None: ...

class WeightChange(_message.Message):
    __slots__ = ("from_step", "weights")
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    from_step: int
    weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, from_step: _Optional[int] = ..., weights: _Optional[_Iterable[float]] = ...) -> None: ...

class SampleLayout(_message.Message):
    __slots__ = ("fields", "label_json_key", "image_feature", "label_feature", "max_field_bytes", "label_offset", "key_feature")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    LABEL_JSON_KEY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FEATURE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FEATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABEL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FEATURE_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedScalarFieldContainer[str]
    label_json_key: str
    image_feature: str
    label_feature: str
    max_field_bytes: int
    label_offset: int
    key_feature: str
    def __init__(self, fields: _Optional[_Iterable[str]] = ..., label_json_key: _Optional[str] = ..., image_feature: _Optional[str] = ..., label_feature: _Optional[str] = ..., max_field_bytes: _Optional[int] = ..., label_offset: _Optional[int] = ..., key_feature: _Optional[str] = ...) -> None: ...

class SharedImages(_message.Message):
    __slots__ = ("ring_token", "ring_bytes", "slot", "offset", "length", "holdable")
    RING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RING_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    HOLDABLE_FIELD_NUMBER: _ClassVar[int]
    ring_token: bytes
    ring_bytes: int
    slot: int
    offset: int
    length: int
    holdable: int
    def __init__(self, ring_token: _Optional[bytes] = ..., ring_bytes: _Optional[int] = ..., slot: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., holdable: _Optional[int] = ...) -> None: ...

class Augmentation(_message.Message):
    __slots__ = ("center_crop", "random_resized_crop", "stretch", "horizontal_flip", "auto_augment", "color_jitter", "grayscale", "random_erasing", "gaussian_blur", "solarize", "vertical_flip", "sharpness", "posterize", "equalize", "autocontrast", "invert", "rotation", "affine", "photometric_distort", "timm_rand_augment", "groups", "resize_interpolation")
    CENTER_CROP_FIELD_NUMBER: _ClassVar[int]
    RANDOM_RESIZED_CROP_FIELD_NUMBER: _ClassVar[int]
    STRETCH_FIELD_NUMBER: _ClassVar[int]
    HORIZONTAL_FLIP_FIELD_NUMBER: _ClassVar[int]
    AUTO_AUGMENT_FIELD_NUMBER: _ClassVar[int]
    COLOR_JITTER_FIELD_NUMBER: _ClassVar[int]
    GRAYSCALE_FIELD_NUMBER: _ClassVar[int]
    RANDOM_ERASING_FIELD_NUMBER: _ClassVar[int]
    GAUSSIAN_BLUR_FIELD_NUMBER: _ClassVar[int]
    SOLARIZE_FIELD_NUMBER: _ClassVar[int]
    VERTICAL_FLIP_FIELD_NUMBER: _ClassVar[int]
    SHARPNESS_FIELD_NUMBER: _ClassVar[int]
    POSTERIZE_FIELD_NUMBER: _ClassVar[int]
    EQUALIZE_FIELD_NUMBER: _ClassVar[int]
    AUTOCONTRAST_FIELD_NUMBER: _ClassVar[int]
    INVERT_FIELD_NUMBER: _ClassVar[int]
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    AFFINE_FIELD_NUMBER: _ClassVar[int]
    PHOTOMETRIC_DISTORT_FIELD_NUMBER: _ClassVar[int]
    TIMM_RAND_AUGMENT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RESIZE_INTERPOLATION_FIELD_NUMBER: _ClassVar[int]
    center_crop: CenterCrop
    random_resized_crop: RandomResizedCrop
    stretch: Stretch
    horizontal_flip: float
    auto_augment: AutoAugment
    color_jitter: ColorJitter
    grayscale: float
    random_erasing: RandomErasing
    gaussian_blur: GaussianBlur
    solarize: RandomSolarize
    vertical_flip: float
    sharpness: RandomAdjustSharpness
    posterize: RandomPosterize
    equalize: float
    autocontrast: float
    invert: float
    rotation: RandomRotation
    affine: RandomAffine
    photometric_distort: RandomPhotometricDistort
    timm_rand_augment: TimmRandAugment
    groups: _containers.RepeatedCompositeFieldContainer[OpGroup]
    resize_interpolation: Interpolation
    def __init__(self, center_crop: _Optional[_Union[CenterCrop, _Mapping]] = ..., random_resized_crop: _Optional[_Union[RandomResizedCrop, _Mapping]] = ..., stretch: _Optional[_Union[Stretch, _Mapping]] = ..., horizontal_flip: _Optional[float] = ..., auto_augment: _Optional[_Union[AutoAugment, _Mapping]] = ..., color_jitter: _Optional[_Union[ColorJitter, _Mapping]] = ..., grayscale: _Optional[float] = ..., random_erasing: _Optional[_Union[RandomErasing, _Mapping]] = ..., gaussian_blur: _Optional[_Union[GaussianBlur, _Mapping]] = ..., solarize: _Optional[_Union[RandomSolarize, _Mapping]] = ..., vertical_flip: _Optional[float] = ..., sharpness: _Optional[_Union[RandomAdjustSharpness, _Mapping]] = ..., posterize: _Optional[_Union[RandomPosterize, _Mapping]] = ..., equalize: _Optional[float] = ..., autocontrast: _Optional[float] = ..., invert: _Optional[float] = ..., rotation: _Optional[_Union[RandomRotation, _Mapping]] = ..., affine: _Optional[_Union[RandomAffine, _Mapping]] = ..., photometric_distort: _Optional[_Union[RandomPhotometricDistort, _Mapping]] = ..., timm_rand_augment: _Optional[_Union[TimmRandAugment, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[OpGroup, _Mapping]]] = ..., resize_interpolation: _Optional[_Union[Interpolation, str]] = ...) -> None: ...

class OpGroup(_message.Message):
    __slots__ = ("kind", "rows", "p", "weights")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    kind: OpGroupKind
    rows: _containers.RepeatedScalarFieldContainer[str]
    p: float
    weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, kind: _Optional[_Union[OpGroupKind, str]] = ..., rows: _Optional[_Iterable[str]] = ..., p: _Optional[float] = ..., weights: _Optional[_Iterable[float]] = ...) -> None: ...

class AutoAugment(_message.Message):
    __slots__ = ("trivial_augment_wide", "rand_augment", "imagenet", "interpolation", "fill")
    TRIVIAL_AUGMENT_WIDE_FIELD_NUMBER: _ClassVar[int]
    RAND_AUGMENT_FIELD_NUMBER: _ClassVar[int]
    IMAGENET_FIELD_NUMBER: _ClassVar[int]
    INTERPOLATION_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    trivial_augment_wide: TrivialAugmentWide
    rand_augment: RandAugment
    imagenet: AutoAugmentImageNet
    interpolation: Interpolation
    fill: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, trivial_augment_wide: _Optional[_Union[TrivialAugmentWide, _Mapping]] = ..., rand_augment: _Optional[_Union[RandAugment, _Mapping]] = ..., imagenet: _Optional[_Union[AutoAugmentImageNet, _Mapping]] = ..., interpolation: _Optional[_Union[Interpolation, str]] = ..., fill: _Optional[_Iterable[int]] = ...) -> None: ...

class TrivialAugmentWide(_message.Message):
    __slots__ = ("num_magnitude_bins",)
    NUM_MAGNITUDE_BINS_FIELD_NUMBER: _ClassVar[int]
    num_magnitude_bins: int
    def __init__(self, num_magnitude_bins: _Optional[int] = ...) -> None: ...

class RandAugment(_message.Message):
    __slots__ = ("num_ops", "magnitude", "num_magnitude_bins")
    NUM_OPS_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_FIELD_NUMBER: _ClassVar[int]
    NUM_MAGNITUDE_BINS_FIELD_NUMBER: _ClassVar[int]
    num_ops: int
    magnitude: int
    num_magnitude_bins: int
    def __init__(self, num_ops: _Optional[int] = ..., magnitude: _Optional[int] = ..., num_magnitude_bins: _Optional[int] = ...) -> None: ...

class AutoAugmentImageNet(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Range(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class ColorJitter(_message.Message):
    __slots__ = ("brightness", "contrast", "saturation", "hue", "p")
    BRIGHTNESS_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_FIELD_NUMBER: _ClassVar[int]
    SATURATION_FIELD_NUMBER: _ClassVar[int]
    HUE_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    brightness: Range
    contrast: Range
    saturation: Range
    hue: Range
    p: float
    def __init__(self, brightness: _Optional[_Union[Range, _Mapping]] = ..., contrast: _Optional[_Union[Range, _Mapping]] = ..., saturation: _Optional[_Union[Range, _Mapping]] = ..., hue: _Optional[_Union[Range, _Mapping]] = ..., p: _Optional[float] = ...) -> None: ...

class GaussianBlur(_message.Message):
    __slots__ = ("kernel_width", "kernel_height", "sigma", "p")
    KERNEL_WIDTH_FIELD_NUMBER: _ClassVar[int]
    KERNEL_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    kernel_width: int
    kernel_height: int
    sigma: Range
    p: float
    def __init__(self, kernel_width: _Optional[int] = ..., kernel_height: _Optional[int] = ..., sigma: _Optional[_Union[Range, _Mapping]] = ..., p: _Optional[float] = ...) -> None: ...

class RandomSolarize(_message.Message):
    __slots__ = ("threshold", "p")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    p: float
    def __init__(self, threshold: _Optional[float] = ..., p: _Optional[float] = ...) -> None: ...

class RandomAdjustSharpness(_message.Message):
    __slots__ = ("sharpness_factor", "p")
    SHARPNESS_FACTOR_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    sharpness_factor: float
    p: float
    def __init__(self, sharpness_factor: _Optional[float] = ..., p: _Optional[float] = ...) -> None: ...

class RandomRotation(_message.Message):
    __slots__ = ("degrees", "interpolation", "fill")
    DEGREES_FIELD_NUMBER: _ClassVar[int]
    INTERPOLATION_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    degrees: Range
    interpolation: Interpolation
    fill: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, degrees: _Optional[_Union[Range, _Mapping]] = ..., interpolation: _Optional[_Union[Interpolation, str]] = ..., fill: _Optional[_Iterable[int]] = ...) -> None: ...

class RandomAffine(_message.Message):
    __slots__ = ("degrees", "translate_x", "translate_y", "scale", "shear_x", "shear_y", "interpolation", "fill")
    DEGREES_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_X_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_Y_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHEAR_X_FIELD_NUMBER: _ClassVar[int]
    SHEAR_Y_FIELD_NUMBER: _ClassVar[int]
    INTERPOLATION_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    degrees: Range
    translate_x: float
    translate_y: float
    scale: Range
    shear_x: Range
    shear_y: Range
    interpolation: Interpolation
    fill: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, degrees: _Optional[_Union[Range, _Mapping]] = ..., translate_x: _Optional[float] = ..., translate_y: _Optional[float] = ..., scale: _Optional[_Union[Range, _Mapping]] = ..., shear_x: _Optional[_Union[Range, _Mapping]] = ..., shear_y: _Optional[_Union[Range, _Mapping]] = ..., interpolation: _Optional[_Union[Interpolation, str]] = ..., fill: _Optional[_Iterable[int]] = ...) -> None: ...

class AffineDrawn(_message.Message):
    __slots__ = ("angle", "translate_x", "translate_y", "scale", "shear_x", "shear_y")
    ANGLE_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_X_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_Y_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHEAR_X_FIELD_NUMBER: _ClassVar[int]
    SHEAR_Y_FIELD_NUMBER: _ClassVar[int]
    angle: float
    translate_x: int
    translate_y: int
    scale: float
    shear_x: float
    shear_y: float
    def __init__(self, angle: _Optional[float] = ..., translate_x: _Optional[int] = ..., translate_y: _Optional[int] = ..., scale: _Optional[float] = ..., shear_x: _Optional[float] = ..., shear_y: _Optional[float] = ...) -> None: ...

class RandomPhotometricDistort(_message.Message):
    __slots__ = ("brightness", "contrast", "saturation", "hue", "p")
    BRIGHTNESS_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_FIELD_NUMBER: _ClassVar[int]
    SATURATION_FIELD_NUMBER: _ClassVar[int]
    HUE_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    brightness: Range
    contrast: Range
    saturation: Range
    hue: Range
    p: float
    def __init__(self, brightness: _Optional[_Union[Range, _Mapping]] = ..., contrast: _Optional[_Union[Range, _Mapping]] = ..., saturation: _Optional[_Union[Range, _Mapping]] = ..., hue: _Optional[_Union[Range, _Mapping]] = ..., p: _Optional[float] = ...) -> None: ...

class RandomPosterize(_message.Message):
    __slots__ = ("bits", "p")
    BITS_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    bits: int
    p: float
    def __init__(self, bits: _Optional[int] = ..., p: _Optional[float] = ...) -> None: ...

class RandomErasing(_message.Message):
    __slots__ = ("p", "scale", "ratio", "colour", "mean", "random", "normalize_mean", "normalize_std")
    P_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    COLOUR_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    RANDOM_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_MEAN_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_STD_FIELD_NUMBER: _ClassVar[int]
    p: float
    scale: Range
    ratio: Range
    colour: Colour
    mean: EraseMean
    random: EraseNoise
    normalize_mean: _containers.RepeatedScalarFieldContainer[float]
    normalize_std: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, p: _Optional[float] = ..., scale: _Optional[_Union[Range, _Mapping]] = ..., ratio: _Optional[_Union[Range, _Mapping]] = ..., colour: _Optional[_Union[Colour, _Mapping]] = ..., mean: _Optional[_Union[EraseMean, _Mapping]] = ..., random: _Optional[_Union[EraseNoise, _Mapping]] = ..., normalize_mean: _Optional[_Iterable[float]] = ..., normalize_std: _Optional[_Iterable[float]] = ...) -> None: ...

class Colour(_message.Message):
    __slots__ = ("levels",)
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    levels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, levels: _Optional[_Iterable[int]] = ...) -> None: ...

class EraseMean(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EraseNoise(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Stretch(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CenterCrop(_message.Message):
    __slots__ = ("resize",)
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    resize: int
    def __init__(self, resize: _Optional[int] = ...) -> None: ...

class RandomResizedCrop(_message.Message):
    __slots__ = ("scale_min", "scale_max", "ratio_min", "ratio_max")
    SCALE_MIN_FIELD_NUMBER: _ClassVar[int]
    SCALE_MAX_FIELD_NUMBER: _ClassVar[int]
    RATIO_MIN_FIELD_NUMBER: _ClassVar[int]
    RATIO_MAX_FIELD_NUMBER: _ClassVar[int]
    scale_min: float
    scale_max: float
    ratio_min: float
    ratio_max: float
    def __init__(self, scale_min: _Optional[float] = ..., scale_max: _Optional[float] = ..., ratio_min: _Optional[float] = ..., ratio_max: _Optional[float] = ...) -> None: ...

class CropBox(_message.Message):
    __slots__ = ("left", "top", "width", "height", "flipped", "policy", "jitter", "grayscale", "erased", "blur_sigma", "solarized", "vertically_flipped", "sharpened", "posterized", "equalized", "autocontrasted", "inverted", "rotation", "affine", "photometric", "channel_permutation", "timm_steps", "applied_rows")
    LEFT_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FLIPPED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    GRAYSCALE_FIELD_NUMBER: _ClassVar[int]
    ERASED_FIELD_NUMBER: _ClassVar[int]
    BLUR_SIGMA_FIELD_NUMBER: _ClassVar[int]
    SOLARIZED_FIELD_NUMBER: _ClassVar[int]
    VERTICALLY_FLIPPED_FIELD_NUMBER: _ClassVar[int]
    SHARPENED_FIELD_NUMBER: _ClassVar[int]
    POSTERIZED_FIELD_NUMBER: _ClassVar[int]
    EQUALIZED_FIELD_NUMBER: _ClassVar[int]
    AUTOCONTRASTED_FIELD_NUMBER: _ClassVar[int]
    INVERTED_FIELD_NUMBER: _ClassVar[int]
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    AFFINE_FIELD_NUMBER: _ClassVar[int]
    PHOTOMETRIC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_PERMUTATION_FIELD_NUMBER: _ClassVar[int]
    TIMM_STEPS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ROWS_FIELD_NUMBER: _ClassVar[int]
    left: float
    top: float
    width: float
    height: float
    flipped: bool
    policy: _containers.RepeatedCompositeFieldContainer[PolicyStep]
    jitter: _containers.RepeatedCompositeFieldContainer[JitterStep]
    grayscale: bool
    erased: ErasedBox
    blur_sigma: float
    solarized: bool
    vertically_flipped: bool
    sharpened: bool
    posterized: bool
    equalized: bool
    autocontrasted: bool
    inverted: bool
    rotation: float
    affine: AffineDrawn
    photometric: _containers.RepeatedCompositeFieldContainer[JitterStep]
    channel_permutation: _containers.RepeatedScalarFieldContainer[int]
    timm_steps: _containers.RepeatedCompositeFieldContainer[TimmStep]
    applied_rows: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, left: _Optional[float] = ..., top: _Optional[float] = ..., width: _Optional[float] = ..., height: _Optional[float] = ..., flipped: _Optional[bool] = ..., policy: _Optional[_Iterable[_Union[PolicyStep, _Mapping]]] = ..., jitter: _Optional[_Iterable[_Union[JitterStep, _Mapping]]] = ..., grayscale: _Optional[bool] = ..., erased: _Optional[_Union[ErasedBox, _Mapping]] = ..., blur_sigma: _Optional[float] = ..., solarized: _Optional[bool] = ..., vertically_flipped: _Optional[bool] = ..., sharpened: _Optional[bool] = ..., posterized: _Optional[bool] = ..., equalized: _Optional[bool] = ..., autocontrasted: _Optional[bool] = ..., inverted: _Optional[bool] = ..., rotation: _Optional[float] = ..., affine: _Optional[_Union[AffineDrawn, _Mapping]] = ..., photometric: _Optional[_Iterable[_Union[JitterStep, _Mapping]]] = ..., channel_permutation: _Optional[_Iterable[int]] = ..., timm_steps: _Optional[_Iterable[_Union[TimmStep, _Mapping]]] = ..., applied_rows: _Optional[_Iterable[str]] = ...) -> None: ...

class TimmRandAugment(_message.Message):
    __slots__ = ("ops", "num_layers", "magnitude", "magnitude_std", "magnitude_max", "prob", "translate_pct", "translate_const", "resample", "random_resample", "fill")
    OPS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_STD_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_MAX_FIELD_NUMBER: _ClassVar[int]
    PROB_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_PCT_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_CONST_FIELD_NUMBER: _ClassVar[int]
    RESAMPLE_FIELD_NUMBER: _ClassVar[int]
    RANDOM_RESAMPLE_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedScalarFieldContainer[TimmOp]
    num_layers: int
    magnitude: float
    magnitude_std: float
    magnitude_max: float
    prob: float
    translate_pct: float
    translate_const: float
    resample: Interpolation
    random_resample: bool
    fill: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ops: _Optional[_Iterable[_Union[TimmOp, str]]] = ..., num_layers: _Optional[int] = ..., magnitude: _Optional[float] = ..., magnitude_std: _Optional[float] = ..., magnitude_max: _Optional[float] = ..., prob: _Optional[float] = ..., translate_pct: _Optional[float] = ..., translate_const: _Optional[float] = ..., resample: _Optional[_Union[Interpolation, str]] = ..., random_resample: _Optional[bool] = ..., fill: _Optional[_Iterable[int]] = ...) -> None: ...

class TimmStep(_message.Message):
    __slots__ = ("op", "argument", "resample")
    OP_FIELD_NUMBER: _ClassVar[int]
    ARGUMENT_FIELD_NUMBER: _ClassVar[int]
    RESAMPLE_FIELD_NUMBER: _ClassVar[int]
    op: TimmOp
    argument: float
    resample: Interpolation
    def __init__(self, op: _Optional[_Union[TimmOp, str]] = ..., argument: _Optional[float] = ..., resample: _Optional[_Union[Interpolation, str]] = ...) -> None: ...

class PolicyStep(_message.Message):
    __slots__ = ("op", "magnitude")
    OP_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_FIELD_NUMBER: _ClassVar[int]
    op: PolicyOp
    magnitude: float
    def __init__(self, op: _Optional[_Union[PolicyOp, str]] = ..., magnitude: _Optional[float] = ...) -> None: ...

class JitterStep(_message.Message):
    __slots__ = ("op", "factor")
    OP_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    op: JitterOp
    factor: float
    def __init__(self, op: _Optional[_Union[JitterOp, str]] = ..., factor: _Optional[float] = ...) -> None: ...

class ErasedBox(_message.Message):
    __slots__ = ("top", "left", "height", "width", "noise")
    TOP_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    top: int
    left: int
    height: int
    width: int
    noise: int
    def __init__(self, top: _Optional[int] = ..., left: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., noise: _Optional[int] = ...) -> None: ...

class EpochPosition(_message.Message):
    __slots__ = ("segments", "dataset", "before_epoch")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    BEFORE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[PositionSegment]
    dataset: str
    before_epoch: _containers.RepeatedCompositeFieldContainer[PositionSegment]
    def __init__(self, segments: _Optional[_Iterable[_Union[PositionSegment, _Mapping]]] = ..., dataset: _Optional[str] = ..., before_epoch: _Optional[_Iterable[_Union[PositionSegment, _Mapping]]] = ...) -> None: ...

class PositionSegment(_message.Message):
    __slots__ = ("world_size", "batches")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    batches: int
    def __init__(self, world_size: _Optional[int] = ..., batches: _Optional[int] = ...) -> None: ...

class Shape(_message.Message):
    __slots__ = ("n", "height", "width", "channels")
    N_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    n: int
    height: int
    width: int
    channels: int
    def __init__(self, n: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., channels: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("epoch", "index", "shape", "images", "labels", "keys", "substituted", "substitution_reasons", "position", "global_samples", "shards", "substitute_sources", "crops", "shared", "fields", "padded", "epoch_steps", "sample_sources", "sample_source_epochs", "encoded", "server_decode_settled", "server_decode_search", "augmentation", "copies", "views")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SUBSTITUTED_FIELD_NUMBER: _ClassVar[int]
    SUBSTITUTION_REASONS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SUBSTITUTE_SOURCES_FIELD_NUMBER: _ClassVar[int]
    CROPS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    PADDED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SOURCES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SOURCE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    SERVER_DECODE_SETTLED_FIELD_NUMBER: _ClassVar[int]
    SERVER_DECODE_SEARCH_FIELD_NUMBER: _ClassVar[int]
    AUGMENTATION_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    index: int
    shape: Shape
    images: bytes
    labels: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    substituted: _containers.RepeatedScalarFieldContainer[int]
    substitution_reasons: _containers.RepeatedScalarFieldContainer[str]
    position: EpochPosition
    global_samples: int
    shards: _containers.RepeatedScalarFieldContainer[str]
    substitute_sources: _containers.RepeatedScalarFieldContainer[int]
    crops: _containers.RepeatedCompositeFieldContainer[CropBox]
    shared: SharedImages
    fields: _containers.RepeatedCompositeFieldContainer[FieldValues]
    padded: _containers.RepeatedScalarFieldContainer[int]
    epoch_steps: int
    sample_sources: _containers.RepeatedScalarFieldContainer[int]
    sample_source_epochs: _containers.RepeatedScalarFieldContainer[int]
    encoded: _containers.RepeatedCompositeFieldContainer[EncodedSample]
    server_decode_settled: float
    server_decode_search: ShareSearch
    augmentation: Augmentation
    copies: _containers.RepeatedScalarFieldContainer[int]
    views: _containers.RepeatedCompositeFieldContainer[ViewBatch]
    def __init__(self, epoch: _Optional[int] = ..., index: _Optional[int] = ..., shape: _Optional[_Union[Shape, _Mapping]] = ..., images: _Optional[bytes] = ..., labels: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[str]] = ..., substituted: _Optional[_Iterable[int]] = ..., substitution_reasons: _Optional[_Iterable[str]] = ..., position: _Optional[_Union[EpochPosition, _Mapping]] = ..., global_samples: _Optional[int] = ..., shards: _Optional[_Iterable[str]] = ..., substitute_sources: _Optional[_Iterable[int]] = ..., crops: _Optional[_Iterable[_Union[CropBox, _Mapping]]] = ..., shared: _Optional[_Union[SharedImages, _Mapping]] = ..., fields: _Optional[_Iterable[_Union[FieldValues, _Mapping]]] = ..., padded: _Optional[_Iterable[int]] = ..., epoch_steps: _Optional[int] = ..., sample_sources: _Optional[_Iterable[int]] = ..., sample_source_epochs: _Optional[_Iterable[int]] = ..., encoded: _Optional[_Iterable[_Union[EncodedSample, _Mapping]]] = ..., server_decode_settled: _Optional[float] = ..., server_decode_search: _Optional[_Union[ShareSearch, _Mapping]] = ..., augmentation: _Optional[_Union[Augmentation, _Mapping]] = ..., copies: _Optional[_Iterable[int]] = ..., views: _Optional[_Iterable[_Union[ViewBatch, _Mapping]]] = ...) -> None: ...

class EncodedSample(_message.Message):
    __slots__ = ("offset", "length", "decoded", "source_width", "source_height", "form")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORM_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    decoded: bool
    source_width: int
    source_height: int
    form: SampleForm
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., decoded: _Optional[bool] = ..., source_width: _Optional[int] = ..., source_height: _Optional[int] = ..., form: _Optional[_Union[SampleForm, str]] = ...) -> None: ...

class ClientDecodeReport(_message.Message):
    __slots__ = ("rank", "decoded", "failures", "loop_waits")
    RANK_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LOOP_WAITS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    decoded: int
    failures: _containers.RepeatedCompositeFieldContainer[ClientDecodeFailure]
    loop_waits: LoopWaits
    def __init__(self, rank: _Optional[int] = ..., decoded: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[ClientDecodeFailure, _Mapping]]] = ..., loop_waits: _Optional[_Union[LoopWaits, _Mapping]] = ...) -> None: ...

class LoopWaits(_message.Message):
    __slots__ = ("loop_id", "waited_seconds", "stepped_seconds", "steps")
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    WAITED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPPED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    loop_id: int
    waited_seconds: float
    stepped_seconds: float
    steps: int
    def __init__(self, loop_id: _Optional[int] = ..., waited_seconds: _Optional[float] = ..., stepped_seconds: _Optional[float] = ..., steps: _Optional[int] = ...) -> None: ...

class ClientDecodeFailure(_message.Message):
    __slots__ = ("shard", "key", "reason")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    shard: str
    key: str
    reason: str
    def __init__(self, shard: _Optional[str] = ..., key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClientDecodeReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FieldValues(_message.Message):
    __slots__ = ("name", "values", "missing")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[bytes]
    missing: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[bytes]] = ..., missing: _Optional[_Iterable[int]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("dataset", "world_size", "batch_size", "partition", "repeats")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    world_size: int
    batch_size: int
    partition: Partition
    repeats: int
    def __init__(self, dataset: _Optional[str] = ..., world_size: _Optional[int] = ..., batch_size: _Optional[int] = ..., partition: _Optional[_Union[Partition, str]] = ..., repeats: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("shards", "samples", "batches_per_rank", "dropped_per_epoch", "padded_per_epoch", "total_bytes", "decoder", "classes", "augmentation_ops")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    DROPPED_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PADDED_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    AUGMENTATION_OPS_FIELD_NUMBER: _ClassVar[int]
    shards: int
    samples: int
    batches_per_rank: int
    dropped_per_epoch: int
    padded_per_epoch: int
    total_bytes: int
    decoder: str
    classes: _containers.RepeatedScalarFieldContainer[str]
    augmentation_ops: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shards: _Optional[int] = ..., samples: _Optional[int] = ..., batches_per_rank: _Optional[int] = ..., dropped_per_epoch: _Optional[int] = ..., padded_per_epoch: _Optional[int] = ..., total_bytes: _Optional[int] = ..., decoder: _Optional[str] = ..., classes: _Optional[_Iterable[str]] = ..., augmentation_ops: _Optional[_Iterable[str]] = ...) -> None: ...
