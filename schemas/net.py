"""NetSpec: a whole net file. The layer union is assembled from the layer models the catalog
registers, discriminated on ``type``."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, Field, StrictInt, model_validator

from .base import InputSpec, LayerBase, Name, Strict
from .quantization import QuantizationSpec
from .train import TrainSpec
from .transform import TransformSpec


class OptimizeSpec(Strict):
    """``optimize: {disable: [PASS, ...]}``: graph passes this net switches off (names are checked
    against the toolkit's pipeline when the net is loaded)."""

    disable: list[Annotated[str, Field(pattern=r"^[a-z_]+$")]] = []


# a bucket: what a 32-bit index holds (toolkit/runtime/session.py's MAX_SIZE, which checks the
# sizes --buckets and the Python API give)
MAX_BUCKET = (1 << 31) - 1
BucketSize = Annotated[StrictInt, Field(gt=0, le=MAX_BUCKET)]
# sizes per symbolic dimension: {N: [1, 8, 32], T: [16, 64, 256]}
BucketsSpec = Optional[dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
                            Annotated[list[BucketSize], Field(min_length=1)]]]


def _not_a_path_component(name: str) -> str:
    """A net's name is its run folder's (runs/NAME) and its zoo model's: never '.' or '..'."""
    if set(name) == {"."}:
        raise ValueError(f"'{name}' cannot be a net's name: it names the run folder runs/NAME")
    return name


def build_net_model(layer_models: list[type[LayerBase]]) -> type[BaseModel]:
    """The NetSpec model for a catalog of layer models (each with ``type: Literal[...]``)."""
    Layer = Annotated[Union[tuple(layer_models)], Field(discriminator="type")]  # type: ignore[valid-type]

    class NetSpec(Strict):
        name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+$"), AfterValidator(_not_a_path_component)]
        inputs: Annotated[dict[Name, InputSpec], Field(min_length=1)]
        layers: Annotated[list[Layer], Field(min_length=1)]
        outputs: Optional[list[Name]] = None
        train: Optional[TrainSpec] = None
        # how images and arrays become the inputs, for a net whose train.data declares no transform
        transform: Optional[TransformSpec] = None
        optimize: Optional[OptimizeSpec] = None
        # int8 post-training quantization of the infer phase: scales per top, float layers
        quantization: Optional[QuantizationSpec] = None
        # the float32 math policy on the GPU: strict FMA or TF32 convolutions (docs/spec.md)
        precision: Optional[Literal["strict", "tf32"]] = None
        # auto: `toolkit compile` places the layers by cost over its --devices (docs/spec.md)
        placement: Optional[Literal["auto"]] = None
        # an extension: sizes per symbolic dimension that infer and serve compile plans for
        # (the batch's, a sequence length's), unless --buckets says otherwise
        buckets: BucketsSpec = None
        # the old name of buckets, still read: it becomes buckets once validated (a file that
        # gives both keeps both, and the net refuses it at gears: frontend/net.py)
        gears: BucketsSpec = Field(None, json_schema_extra={"deprecated": True})

        @model_validator(mode="after")
        def _gears_are_buckets(self):
            if self.gears is not None and self.buckets is None:
                self.buckets, self.gears = self.gears, None
            return self

        @model_validator(mode="after")
        def _one_transform(self):
            data = self.train.data if self.train is not None else None
            given = [k for k in DATA_TRANSFORM_KEYS if data is not None and getattr(data, k) is not None]
            if self.transform is not None and given:
                raise ValueError(f"the input transform is declared twice: in transform and in train.data "
                                 f"({', '.join(given)}); keep one")
            return self

    return NetSpec


# train.data's keys that make an input transform (Caffe's transform_param)
DATA_TRANSFORM_KEYS = ("scale", "mean", "mean_value", "mean_file", "crop_size")


def json_schema(net_model: type[BaseModel]) -> dict[str, Any]:
    schema = net_model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "toolkit net"
    return schema
