"""Revision scripts of credential_service (a package so installs ship them)."""
