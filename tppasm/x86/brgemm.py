"""x86 BRGEMM generators (placeholder until the BRGEMM work lands)."""
