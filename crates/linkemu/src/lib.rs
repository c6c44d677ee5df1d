//! pep-linkemu (issue 3).
