//! tally proxy
