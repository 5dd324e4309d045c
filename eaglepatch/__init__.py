"""eaglepatch: time the phases of SGLang speculative decoding on a live server, and put every byte back."""

__version__ = "0.1.0"
