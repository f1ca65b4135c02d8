//! lunkit
