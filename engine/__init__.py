"""engine: a small but complete speculative-decoding engine, the system under test of specval.

The engine never imports specval.
"""

from engine.api import LLM, Engine
from engine.config import EngineConfig, ModelConfig, SpeculativeConfig
from engine.params import SamplingParams
from engine.request import RequestOutput

__all__ = ["LLM", "Engine", "EngineConfig", "ModelConfig", "RequestOutput", "SamplingParams", "SpeculativeConfig"]
