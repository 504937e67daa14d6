"""`medclr export`: a trained checkpoint in the formats other tools read (Hugging Face folder with a model
card, ONNX, TorchScript)."""
