"""Speed of the engine (ONNX Runtime variants vs transformers) and of the training step."""
