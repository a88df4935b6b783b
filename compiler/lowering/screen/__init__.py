"""The certificate on the GPU: head activation frequencies, the per-query plan and the screen."""
