//! `ictus display` (written below).
