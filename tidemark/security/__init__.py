"""Security helpers shared by the services and the tools: certificates for mTLS."""
