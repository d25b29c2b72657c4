"""KV-cache compression methods behind one cache seam (``methods.seam``), one entry per method.

``METHOD_REGISTRY`` maps the command-line name to the class; importing this package registers the
``"kvbench"`` attention implementation with transformers.
"""

from methods.adakv import AdaKV
from methods.chunkkv import ChunkKV
from methods.criticalkv import CriticalKV
from methods.cur import CurDKV
from methods.dms import DMS
from methods.duo_attention import DuoAttention
from methods.evict import ScoreEvict
from methods.expected_attention import ExpectedAttention
from methods.fullkv import FullKV
from methods.h2o import H2O
from methods.keepkv import KeepKV
from methods.key_rerotation import KeyRerotation
from methods.keydiff import KeyDiff
from methods.knorm import KNorm
from methods.kvmerger import KVMerger
from methods.kvzip import KVzip
from methods.lagkv import LagKV
from methods.layer_ratios import LayerRatios
from methods.less import LESS
from methods.leverage_score import LeverageScore
from methods.observed_attention import ObservedAttention
from methods.pyramidkv import PyramidKV
from methods.random import Random
from methods.rkv import RKV
from methods.seam import attention  # noqa: F401  (registers the attention implementation)
from methods.seam.cache import CompressedCache
from methods.seam.contract import CompressionMethod
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.uniform import SlotStore
from methods.simlayerkv import SimLayerKV
from methods.snapkv import SnapKV
from methods.streamingllm import StreamingLLM
from methods.think import ThinK
from methods.tova import TOVA
from methods.zsmerge import ZSMerge

METHOD_REGISTRY: dict[str, type[CompressionMethod]] = {
    cls.name: cls
    for cls in (
        AdaKV,
        ChunkKV,
        DMS,
        DuoAttention,
        CriticalKV,
        CurDKV,
        ExpectedAttention,
        FullKV,
        H2O,
        KeepKV,
        KeyDiff,
        KeyRerotation,
        KNorm,
        KVMerger,
        KVzip,
        LayerRatios,
        LagKV,
        LESS,
        LeverageScore,
        ObservedAttention,
        PyramidKV,
        Random,
        RKV,
        SimLayerKV,
        SnapKV,
        StreamingLLM,
        ThinK,
        TOVA,
        ZSMerge,
    )
}

__all__ = [
    "DMS",
    "H2O",
    "LESS",
    "METHOD_REGISTRY",
    "RKV",
    "TOVA",
    "AdaKV",
    "ChunkKV",
    "CompressedCache",
    "CompressedLayer",
    "CompressionMethod",
    "CriticalKV",
    "CurDKV",
    "DuoAttention",
    "ExpectedAttention",
    "FullKV",
    "KNorm",
    "KVMerger",
    "KVzip",
    "KeepKV",
    "KeyDiff",
    "KeyRerotation",
    "LagKV",
    "LayerPlan",
    "LayerRatios",
    "LeverageScore",
    "ObservedAttention",
    "PyramidKV",
    "Random",
    "ScoreEvict",
    "SimLayerKV",
    "SlotStore",
    "SnapKV",
    "StreamingLLM",
    "ThinK",
    "ZSMerge",
]
