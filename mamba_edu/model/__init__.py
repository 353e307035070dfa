"""The hybrid Gated DeltaNet + attention model with random weights, and its presets.

The MLP of every layer is a dense stand-in for the model's mixture of experts (active width).
"""

from mamba_edu.model.config import PRESETS, ModelConfig, get_config
from mamba_edu.model.hybrid import HybridLayer, HybridModel, ModelOutput, build_model
from mamba_edu.model.layers import MLP, Attention, GDNMixer, RMSNorm

__all__ = ["MLP", "PRESETS", "Attention", "GDNMixer", "HybridLayer", "HybridModel", "ModelConfig",
           "ModelOutput", "RMSNorm", "build_model", "get_config"]
