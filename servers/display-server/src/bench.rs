//! The experiment (written below).
