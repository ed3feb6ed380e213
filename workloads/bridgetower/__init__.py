"""BridgeTower contrastive fine-tuning, after Hugging Face's Gaudi2/H100/A100 benchmark."""

from workloads.bridgetower.workload import BridgeTowerWorkload

__all__ = ["BridgeTowerWorkload"]
