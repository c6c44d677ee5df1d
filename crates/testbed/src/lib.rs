//! pep-testbed (issue 3).
