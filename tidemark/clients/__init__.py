"""Typed clients for Tidemark's services, for other services and for tools."""
