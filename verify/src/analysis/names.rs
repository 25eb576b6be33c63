//! Tool, operation and worker names, shared: one allocation each however many open
//! attempts and loop series hold them. Bounded: when full it forgets them all (sharing
//! saves memory only; nothing is decided by it).

use std::sync::Arc;

/// Most distinct names, and combinations of a call's names, [`Names`] shares before it
/// starts afresh.
const MAX_SHARED_NAMES: usize = 4096;

/// A call's names, shared.
#[derive(Debug)]
pub(crate) struct CallNames {
    pub tool: Option<Arc<str>>,
    pub operation: Option<Arc<str>>,
    pub worker: Option<Arc<str>>,
}

/// The shared names.
#[derive(Debug, Default)]
pub(crate) struct Names {
    text: crate::hash::Set<Arc<str>>,
    /// By the addresses of the shared names: each stays allocated while its entry holds it.
    calls: crate::hash::Map<[usize; 3], Arc<CallNames>>,
}

impl Names {
    fn get(&mut self, name: Option<&str>) -> Option<Arc<str>> {
        let name = name?;
        if let Some(shared) = self.text.get(name) {
            return Some(Arc::clone(shared));
        }
        if self.text.len() >= MAX_SHARED_NAMES {
            self.text.clear();
        }
        let shared: Arc<str> = Arc::from(name);
        self.text.insert(Arc::clone(&shared));
        Some(shared)
    }

    /// A call's names, shared with every call that has the same.
    pub fn call(
        &mut self,
        tool: Option<&str>,
        operation: Option<&str>,
        worker: Option<&str>,
    ) -> Arc<CallNames> {
        let names = CallNames {
            tool: self.get(tool),
            operation: self.get(operation),
            worker: self.get(worker),
        };
        let address = |n: &Option<Arc<str>>| {
            n.as_ref()
                .map_or(0, |n| Arc::as_ptr(n).cast::<u8>() as usize)
        };
        let id = [&names.tool, &names.operation, &names.worker].map(address);
        if let Some(shared) = self.calls.get(&id) {
            return Arc::clone(shared);
        }
        if self.calls.len() >= MAX_SHARED_NAMES {
            self.calls.clear();
        }
        let shared = Arc::new(names);
        self.calls.insert(id, Arc::clone(&shared));
        shared
    }
}
