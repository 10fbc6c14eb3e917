"""Generated gRPC stubs (see gen_stubs.py); do not edit."""
