"""AWQ quantization of a ChatTTSDeployment's weights, a feature of its own: ``plan.py`` (pure: the Job
it asks for, which weights the pods mount, the Quantized condition) and ``controller.py`` (the
reconcile step the deployment controller is handed). The models are in ``api/quantization.py``."""
