//! Raw kernel ABI for lunkit. Filled in by the Foundation issue.
#![no_std]
