//! The library's only `unsafe`: raw ioctls on block devices and `/dev/mapper/control`.
#![allow(unsafe_code)]
