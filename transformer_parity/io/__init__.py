"""Files in and out, safely: atomic writes and output directories (`atomic`, `outputs`), size limits checked before
anything is allocated (`limits`), the canonical safetensors files streamed tensor by tensor (`safetensors_io`),
container sniffing (`sniff`) and names made safe to print (`safe_text`)."""
