"""R-MDM: a shared K-layer transformer block looped L times inside every denoising step."""
from model.config import ModelConfig, TrainConfig
from model.rmdm import RecursiveDenoiser, SeqSpec, flops_per_forward
from model.sampler import sample
from model.train import Trainer

__all__ = ["ModelConfig", "TrainConfig", "RecursiveDenoiser", "SeqSpec", "flops_per_forward", "sample", "Trainer"]
