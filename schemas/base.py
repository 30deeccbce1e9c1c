"""Pydantic building blocks shared by every layer model: the common layer keys, fillers, inputs.

Depends on pydantic only. Layer parameter models subclass ``LayerBase`` (or ``ParamLayerBase``
for layers with learnable weights) next to their lowering in ``layers/``.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-/]+$")]
Phase = Literal["train", "test", "infer"]
# where a layer runs: cpu or gpu, or one of several (cpu:1, gpu:0)
DeviceName = Annotated[str, Field(pattern=r"^(cpu|gpu)(:[0-9]+)?$")]
PHASES: tuple[str, ...] = ("train", "test", "infer")
DType = Literal["float32", "float64", "int32", "int64", "bool"]   # bool: masks (key_padding_mask)
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
Number = Union[StrictInt, float]
# kernel_size / stride / pad / dilation: one number for both axes, or [h, w]
Pair = Union[PositiveInt, Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]]
PadPair = Union[NonNegInt, Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]]
Bool = StrictBool


class Strict(BaseModel):
    """Unknown keys are errors everywhere in a net file. Validators are built on first use
    (``defer_build``): a command validates a net over the few layer types it names
    (``layers.net_model_for``), and building all of the catalog's took most of its start-up."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, defer_build=True)


class ConstantFiller(Strict):
    type: Literal["constant"]
    value: Number = 0.0


class UniformFiller(Strict):
    type: Literal["uniform"]
    min: Number = 0.0
    max: Number = 1.0


class GaussianFiller(Strict):
    """``sparse``: Caffe's sparse gaussian, each value kept with probability sparse / shape[0]
    (the expected non-zero inputs of each output), the others zero."""
    type: Literal["gaussian"]
    mean: Number = 0.0
    std: Annotated[float, Field(ge=0)] = 1.0
    sparse: Optional[Annotated[int, Field(ge=1)]] = None


class BilinearFiller(Strict):
    """Caffe's bilinear: the interpolation kernel of a square [O, I, k, k] Deconvolution weight,
    for upsampling by a factor of about k / 2."""
    type: Literal["bilinear"]


class PositiveUnitballFiller(Strict):
    """Caffe's positive_unitball: uniform in [0, 1), each output's values scaled to sum to 1."""
    type: Literal["positive_unitball"]


class XavierFiller(Strict):
    """Caffe's xavier: uniform in +-sqrt(3 / n), n = fan_in (default), fan_out or their average."""

    type: Literal["xavier"]
    variance_norm: Literal["fan_in", "fan_out", "average"] = "fan_in"


class MsraFiller(Strict):
    """Caffe's msra (He): gaussian with std sqrt(2 / n), n as for xavier."""

    type: Literal["msra"]
    variance_norm: Literal["fan_in", "fan_out", "average"] = "fan_in"


Filler = Annotated[Union[ConstantFiller, UniformFiller, GaussianFiller, XavierFiller, MsraFiller, BilinearFiller,
                         PositiveUnitballFiller], Field(discriminator="type")]


class InputSpec(Strict):
    shape: Annotated[list[Union[PositiveInt, Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]]],
                     Field(min_length=0)]
    dtype: DType = "float32"


class LayerBase(Strict):
    """Keys every layer has. ``type`` is narrowed to a Literal by each layer model.

    - ``name``: the layer's name, unique in the net; its weights are stored under it
    - ``type``: the layer type, one of the catalog's
    - ``bottom``: the blob or blobs the layer reads, each produced above it or an input
    - ``top``: the blob or blobs the layer writes (``top == bottom`` is an in-place layer)
    - ``phase``: ``train``, ``test``, ``infer`` or a list of them; without one, every phase
    - ``loss_weight``: the weight of this layer's loss tops in the training objective (default 1)
    - ``device``: where the layer runs: ``cpu`` or ``gpu``, or one of several (``gpu:1``)
    """

    name: Name
    type: str
    bottom: Union[Name, list[Name]] = []
    top: Union[Name, list[Name]] = []
    phase: Union[Phase, list[Phase], None] = None
    loss_weight: Union[Number, list[Number], None] = None
    device: Optional[DeviceName] = None

    # How many bottoms and tops the layer takes: (least, most), most None for no limit.
    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (1, 1)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, 1)

    @property
    def bottoms(self) -> list[str]:
        return [self.bottom] if isinstance(self.bottom, str) else list(self.bottom)

    @property
    def tops(self) -> list[str]:
        return [self.top] if isinstance(self.top, str) else list(self.top)

    @property
    def phases(self) -> tuple[str, ...]:
        if self.phase is None:
            return PHASES
        return (self.phase,) if isinstance(self.phase, str) else tuple(self.phase)


class ParamLayerBase(LayerBase):
    """A layer with learnable weights: per-parameter multipliers, sharing and fillers.

    - ``lr_mult``: scales the solver's learning rate, one number or one per parameter in order
    - ``decay_mult``: scales the solver's weight decay, one number or one per parameter in order
    - ``share``: another layer whose parameters this one uses (all of them), or a map from
      parameter name to layer (only those named, Caffe's ``param { name }``)
    - ``weight_filler``: how the weight starts (default xavier)
    - ``bias_filler``: how the bias starts (default constant 0)
    """

    lr_mult: Union[Number, list[Number], None] = None
    decay_mult: Union[Number, list[Number], None] = None
    # another layer whose parameters this one uses: all of them (a name), or some, by parameter
    # name ({weight: conv1}: Caffe's param { name } shared blob by blob)
    share: Union[Name, dict[Name, Name], None] = None
    weight_filler: Union[Filler, None] = None
    bias_filler: Union[Filler, None] = None


def weight_owner(layer, pname: str) -> str:
    """The layer whose parameter ``pname`` this layer uses: the one ``share`` names for it, else
    the layer itself."""
    share = getattr(layer, "share", None)
    if isinstance(share, dict):
        return share.get(pname) or layer.name
    return share or layer.name

