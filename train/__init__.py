"""Training: data sets, samplers and miners, losses, the trainer, evaluation and ONNX export."""
