//! Typed keys through which plugins hand data to each other.

use std::any::{Any, TypeId};
use std::fmt;
use std::marker::PhantomData;

/// A typed slot in the request context. Declare keys as constants:
///
/// ```
/// use router_policy::Key;
/// pub const TENANT: Key<String> = Key::new("tenant");
/// ```
pub struct Key<T> {
    name: &'static str,
    _t: PhantomData<fn() -> T>,
}

impl<T> Key<T> {
    /// A key named `name`. Two keys are the same key when name and type agree.
    pub const fn new(name: &'static str) -> Self {
        Key {
            name,
            _t: PhantomData,
        }
    }

    /// The key's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T: 'static> Key<T> {
    /// The untyped identity of the key, for `needs` and `produces` lists.
    pub fn id(&self) -> KeyId {
        KeyId {
            name: self.name,
            type_id: TypeId::of::<T>(),
        }
    }
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Key<T> {}

impl<T> fmt::Debug for Key<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.name)
    }
}

/// A key's name and type, without the type parameter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct KeyId {
    name: &'static str,
    type_id: TypeId,
}

impl KeyId {
    /// The key's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Per-request data shared by the plugins of a profile.
///
/// A handful of values per request: a small vector beats a map.
#[derive(Default)]
pub struct Context {
    values: Vec<(KeyId, Box<dyn Any + Send + Sync>)>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.values.iter().map(|(k, _)| k.name))
            .finish()
    }
}

impl Context {
    /// An empty context.
    pub fn new() -> Self {
        Context::default()
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn insert<T: Send + Sync + 'static>(&mut self, key: Key<T>, value: T) {
        let id = key.id();
        match self.values.iter_mut().find(|(k, _)| *k == id) {
            Some(slot) => slot.1 = Box::new(value),
            None => self.values.push((id, Box::new(value))),
        }
    }

    /// The value of `key`, if set.
    pub fn get<T: 'static>(&self, key: Key<T>) -> Option<&T> {
        let id = key.id();
        self.values
            .iter()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_ref())
    }

    /// The value of `key` for changing in place, if set.
    pub fn get_mut<T: 'static>(&mut self, key: Key<T>) -> Option<&mut T> {
        let id = key.id();
        self.values
            .iter_mut()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_mut())
    }

    /// Removes every value, keeping the allocation for the next request.
    pub fn clear(&mut self) {
        self.values.clear();
    }
}
