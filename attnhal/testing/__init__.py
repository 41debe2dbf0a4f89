"""Testing tools for backend authors: hypothesis strategies and the conformance kit.

Importing ``attnhal.testing`` needs ``hypothesis`` (``pip install 'attnhal[test]'``).
"""
