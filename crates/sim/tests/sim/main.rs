//! Integration tests of router-sim.

mod cache;
mod replay;
mod residency;
mod trace;
