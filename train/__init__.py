"""Training (the `train` extra): samplers, miners, weightings, losses, the trainer and ONNX export.

    from metricsearch.train import load_config, train, export_onnx
    run = train(load_config("digits"))
    export_onnx(run.run_dir, "digits.onnx")
"""

from metricsearch.train.config import load_config
from metricsearch.train.export import ExportReport, export_onnx, export_pretrained
from metricsearch.train.losses.pair_weight_plots import inspect_loss
from metricsearch.train.quantize import QuantizeReport, quantize_onnx
from metricsearch.train.trainer import RunExistsError, RunResult, TrainingError, train

__all__ = ["ExportReport", "QuantizeReport", "RunExistsError", "RunResult", "TrainingError", "export_onnx",
           "export_pretrained", "inspect_loss", "load_config", "quantize_onnx", "train"]
