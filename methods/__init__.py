"""KV-cache compression methods behind one cache seam (``methods.seam``), one entry per method.

``METHOD_REGISTRY`` maps the command-line name to the class; importing this package registers the
``"kvbench"`` attention implementation with transformers.
"""

from methods.adakv import AdaKV
from methods.block import Block
from methods.cam import CAM
from methods.cap import Cap
from methods.chunk import Chunk
from methods.chunkkv import ChunkKV
from methods.compactor import Compactor
from methods.criticalkv import CriticalKV
from methods.cur import CurDKV
from methods.dms import DMS
from methods.duo_attention import DuoAttention
from methods.entropy_gated_chunkkv import EntropyGatedChunkKV
from methods.evict import ScoreEvict
from methods.expected_attention import ExpectedAttention
from methods.finch import Finch
from methods.fullkv import FullKV
from methods.h2o import H2O
from methods.keepkv import KeepKV
from methods.key_rerotation import KeyRerotation
from methods.keydiff import KeyDiff
from methods.knorm import KNorm
from methods.kvcompose import KVCompose
from methods.kvgrad import KVgrad
from methods.kvmerger import KVMerger
from methods.kvzip import KVzip
from methods.lagkv import LagKV
from methods.layer_ratios import LayerRatios
from methods.less import LESS
from methods.leverage_score import LeverageScore
from methods.merging import Merging
from methods.non_causal_attn import NonCausalAttn
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
        Cap,
        Block,
        Chunk,
        CAM,
        ChunkKV,
        Compactor,
        DMS,
        DuoAttention,
        EntropyGatedChunkKV,
        CriticalKV,
        CurDKV,
        ExpectedAttention,
        Finch,
        FullKV,
        H2O,
        KeepKV,
        KeyDiff,
        KeyRerotation,
        KNorm,
        KVCompose,
        KVMerger,
        KVgrad,
        KVzip,
        LayerRatios,
        LagKV,
        LESS,
        LeverageScore,
        NonCausalAttn,
        Merging,
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
    "CAM",
    "DMS",
    "H2O",
    "LESS",
    "METHOD_REGISTRY",
    "RKV",
    "TOVA",
    "AdaKV",
    "Block",
    "Cap",
    "Chunk",
    "ChunkKV",
    "Compactor",
    "CompressedCache",
    "CompressedLayer",
    "CompressionMethod",
    "CriticalKV",
    "CurDKV",
    "DuoAttention",
    "EntropyGatedChunkKV",
    "ExpectedAttention",
    "Finch",
    "FullKV",
    "KNorm",
    "KVCompose",
    "KVMerger",
    "KVgrad",
    "KVzip",
    "KeepKV",
    "KeyDiff",
    "KeyRerotation",
    "LagKV",
    "LayerPlan",
    "LayerRatios",
    "LeverageScore",
    "Merging",
    "NonCausalAttn",
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
