"""Training (the `train` extra): samplers, miners, weightings, losses, the trainer and ONNX export.

    from metricsearch.train import load_config, train, export_onnx
    run = train(load_config("configs/digits.yaml"))
    export_onnx(run.run_dir, "digits.onnx")
"""

from metricsearch.train.config import load_config
from metricsearch.train.export import ExportReport, export_onnx, export_pretrained
from metricsearch.train.losses.inspect import inspect_loss
from metricsearch.train.trainer import RunResult, TrainingError, train

__all__ = ["ExportReport", "RunResult", "TrainingError", "export_onnx", "export_pretrained", "inspect_loss", "load_config", "train"]
