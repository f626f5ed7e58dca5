"""Layer 3: reading inputs, checking schemas, publishing releases atomically."""
