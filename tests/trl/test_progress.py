"""What a TRL run prints: our step bar instead of the trainer's raw log dictionaries."""

from __future__ import annotations

import logging

import pytest
from rich.console import Console

from deepanalyze_env.trainers.trl.progress import quiet_console


@pytest.fixture
def trainer(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    return Trainer(model=model, args=args)


def test_raw_dict_printers_are_replaced_by_one_step_bar(trainer):
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    assert any(isinstance(c, ProgressCallback | PrinterCallback) for c in trainer.callback_handler.callbacks)
    quiet_console(trainer, Console(), "GRPO")
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert "ProgressCallback" not in names and "PrinterCallback" not in names
    assert names.count("StepProgress") == 1


def test_only_trls_none_reward_warning_is_dropped(trainer, caplog):
    quiet_console(trainer, Console(), "GRPO")
    grpo_log = logging.getLogger("trl.trainer.grpo_trainer")
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        grpo_log.warning("[RANK 0] All reward functions returned None for the following kwargs: {...}")
        grpo_log.warning("something else went wrong")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]
