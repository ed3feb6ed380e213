"""Engine ``hf-trainer``: the same configuration through transformers' ``Trainer``, as the published
benchmark ran (optimum-habana's ``GaudiTrainer`` with a Gaudi config equivalent to ``Habana/clip`` on
Gaudi2), measured with the suite's accounting through hooks:

* the train dataloader is wrapped so that taking a batch ends the step's data wait (``hooks.batch_ready``);
* a ``TrainerCallback`` ends each step after the optimizer step (``hooks.step_end`` with the step's exact
  loss, captured from ``training_step``), where the suite synchronizes the device and reads its clock.

The trainer's own ``train_samples_per_second`` (all steps over its whole runtime, warm-up and worker
start-up included, as the blog reported it) is returned beside, so the two accountings sit side by side.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from torch.utils.data import default_collate

from suite.errors import SuiteError


def collate_for_trainer(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Our dataset items -> the model's keyword arguments (as run_bridgetower.py's collator)."""
    batch = default_collate(items)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "pixel_values": batch["images"], "return_loss": True}


class _TimedLoader:
    """The trainer's dataloader, reporting each batch taken to the suite's clock (and to the workload, which
    notes the worker pipeline that made it)."""

    def __init__(self, loader: Any, hooks: Any, workload: Any) -> None:
        self._loader, self._hooks, self._workload = loader, hooks, workload

    def __iter__(self) -> Any:
        for batch in self._loader:
            self._hooks.batch_ready(batch)
            self._workload.note_worker_pipeline_ran()
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # sampler, dataset, set_epoch... of the wrapped loader
        return getattr(self._loader, name)


def trainer_arguments(config: Any, preset: Any, device: Any) -> tuple[type, Any, dict[str, Any]]:
    """The trainer class of ``device``, its training arguments (device set-up done: ``n_gpu`` read) and the extra
    keyword arguments of the trainer: ``GaudiTrainer`` with ``GaudiTrainingArguments`` on Gaudi2, in the mode the
    bridge runs (the adapter has set ``PT_HPU_LAZY_MODE`` to match, which optimum-habana reads), else transformers'."""
    common = dict(
        output_dir=tempfile.mkdtemp(prefix="suite-hf-trainer-"), max_steps=config.total_steps,
        per_device_train_batch_size=config.batch_size, learning_rate=preset.learning_rate,
        weight_decay=preset.weight_decay, adam_epsilon=preset.adam_epsilon, max_grad_norm=preset.max_grad_norm,
        lr_scheduler_type="linear", warmup_steps=0, seed=config.seed, data_seed=config.seed,
        dataloader_num_workers=config.num_workers, dataloader_drop_last=True,
        dataloader_persistent_workers=config.num_workers > 0, remove_unused_columns=False,
        bf16=config.precision == "bf16", report_to=[], save_strategy="no", logging_strategy="no",
        disable_tqdm=True,
    )
    if device.torch_device.type == "hpu":
        trainer_cls, args = _gaudi_trainer(common, config.precision, device)
        extra: dict[str, Any] = {"gaudi_config": args.pop("gaudi_config")}
        from optimum.habana import GaudiTrainingArguments

        training_args = GaudiTrainingArguments(**args)
    else:
        from transformers import Trainer, TrainingArguments

        trainer_cls, extra = Trainer, {}
        training_args = TrainingArguments(use_cpu=device.torch_device.type == "cpu", optim="adamw_torch", **common)
    refuse_data_parallel(training_args)  # reads n_gpu: the arguments' device set-up runs here, before any step
    return trainer_cls, training_args, extra


def run_with_trainer(workload: Any, hooks: Any) -> dict[str, float]:
    """Train ``workload``'s model for ``warmup_steps + steps`` steps with the trainer of its device."""
    config, preset, device = workload.config, workload.preset, workload.device
    if config.loader != "cpu":
        raise SuiteError(f"engine hf-trainer runs the published method's loader only (cpu), not {config.loader!r}")
    from transformers import TrainerCallback

    trainer_cls, training_args, extra = trainer_arguments(config, preset, device)

    class StepEnd(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            hooks.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if hooks.step_end(trainer.last_loss):  # the quality target is met
                control.should_training_stop = True

    class TimedTrainer(trainer_cls):  # type: ignore[misc, valid-type]
        last_loss: Any = None

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.last_loss = loss.detach()
            return loss

        def get_train_dataloader(self) -> Any:
            loader = super().get_train_dataloader()
            workload.record_trainer_loader(getattr(loader, "base_dataloader", loader))
            return _TimedLoader(loader, hooks, workload)

    model = workload.model.module if hasattr(workload.model, "module") else workload.model
    trainer = TimedTrainer(model=model, args=training_args, train_dataset=workload.train_dataset,
                           data_collator=collate_for_trainer, callbacks=[StepEnd()], **extra)
    output = trainer.train()
    figures = {k: float(v) for k, v in output.metrics.items()
               if k in ("train_samples_per_second", "train_steps_per_second", "train_runtime")}
    workload.record_trainer_facts(trainer_cls.__module__ + "." + trainer_cls.__name__,
                                  type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer")
                                       else trainer.optimizer).__name__)
    return figures


def refuse_data_parallel(training_args: Any) -> None:
    """One device per configuration: without torchrun, the Trainer wraps the model in ``nn.DataParallel`` over every
    visible GPU and multiplies the batch by their count (``TrainingArguments.n_gpu``). The runner pins a
    single-process CUDA configuration to one GPU (``CUDAAdapter.child_environment``); this refuses, never
    silently accepts, a trainer that would spread anyway."""
    n_gpu = getattr(training_args, "n_gpu", 0)
    if n_gpu > 1:
        raise SuiteError(f"the Trainer sees {n_gpu} GPUs and would run nn.DataParallel over them (batch x {n_gpu}): a "
                         "configuration runs on one device; set CUDA_VISIBLE_DEVICES or use --nproc-per-node")


def gaudi_config_kwargs(precision: str) -> dict[str, bool]:
    """``GaudiConfig`` as the reference's ``Habana/clip``: fused AdamW and clipping, and torch autocast for bf16 only
    (optimum-habana's trainer turns autocast on whenever ``use_torch_autocast`` is set, even with ``bf16=False``:
    fp32 must ask for it off, or it runs bf16 while fp32 is recorded)."""
    return {"use_fused_adam": True, "use_fused_clip_norm": True, "use_torch_autocast": precision == "bf16"}


def _gaudi_trainer(common: dict[str, Any], precision: str, device: Any) -> tuple[Any, dict[str, Any]]:
    """GaudiTrainer with a Gaudi config equivalent to ``Habana/clip``, in the mode the bridge runs."""
    try:
        from optimum.habana import GaudiConfig, GaudiTrainer
    except ImportError as exc:
        raise SuiteError(f"engine hf-trainer on Gaudi2 needs optimum-habana: pip install 'suite-bench[gaudi]' "
                         f"({exc})") from exc
    gaudi_config = GaudiConfig(**gaudi_config_kwargs(precision))
    args = dict(common, use_habana=True, use_lazy_mode=device.mode == "lazy", gaudi_config=gaudi_config)
    return GaudiTrainer, args
