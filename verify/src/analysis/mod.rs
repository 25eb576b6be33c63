//! Loops, consistency audit and handoffs over verified, decrypted decisions.
//! (Being written: see issue 4.)
