//! Profiles: plugins composed and checked before any traffic.

use std::collections::HashSet;
use std::fmt;

use router_core::PodId;

use crate::Error;
use crate::context::{Context, KeyId};
use crate::plugin::{Filter, Picker, Plugin, Prepare, Scorer};
use crate::pod::PodState;

/// A validated composition: prepare -> filter -> score -> pick.
pub struct Profile {
    name: String,
    prepares: Vec<Box<dyn Prepare>>,
    filters: Vec<Box<dyn Filter>>,
    scorers: Vec<(Box<dyn Scorer>, f64)>,
    picker: Box<dyn Picker>,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("name", &self.name)
            .field("prepares", &self.prepares)
            .field("filters", &self.filters)
            .field("scorers", &self.scorers)
            .field("picker", &self.picker)
            .finish()
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The chosen pod.
    pub pod: PodId,
    /// Its weighted total score.
    pub score: f64,
    /// Candidates left after filtering.
    pub candidates: usize,
}

impl Profile {
    /// Starts a profile named `name`.
    pub fn builder(name: impl Into<String>) -> ProfileBuilder {
        ProfileBuilder {
            name: name.into(),
            inputs: Vec::new(),
            prepares: Vec::new(),
            filters: Vec::new(),
            scorers: Vec::new(),
            picker: None,
        }
    }

    /// The profile's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Decides for one request. `pods` are the candidates (a fleet
    /// snapshot); filters remove pods from it in place. An empty set after a
    /// filter is an error naming that filter (the gateway's 503).
    pub fn decide(&self, ctx: &mut Context, pods: &mut Vec<PodState>) -> Result<Decision, Error> {
        if pods.is_empty() {
            return Err(Error::NoCandidates {
                filter: "fleet".into(),
            });
        }
        for p in &self.prepares {
            p.prepare(ctx, pods);
        }
        for f in &self.filters {
            f.retain(ctx, pods);
            if pods.is_empty() {
                return Err(Error::NoCandidates {
                    filter: f.name().to_owned(),
                });
            }
        }
        // One allocation for the running total and one scorer's scores.
        let mut buf = vec![0.0; 2 * pods.len()];
        let (total, one) = buf.split_at_mut(pods.len());
        for (s, w) in &self.scorers {
            one.iter_mut().for_each(|x| *x = 0.0);
            s.score(ctx, pods, one);
            for (t, x) in total.iter_mut().zip(one.iter()) {
                *t += w * x;
            }
        }
        let i = self
            .picker
            .pick(ctx, pods, total)
            .filter(|&i| i < pods.len())
            .unwrap_or(0);
        let chosen = &pods[i];
        for p in &self.prepares {
            p.on_pick(ctx, chosen);
        }
        for f in &self.filters {
            f.on_pick(ctx, chosen);
        }
        for (s, _) in &self.scorers {
            s.on_pick(ctx, chosen);
        }
        self.picker.on_pick(ctx, chosen);
        Ok(Decision {
            pod: chosen.id,
            score: total[i],
            candidates: pods.len(),
        })
    }
}

/// Assembles a [`Profile`]; [`ProfileBuilder::build`] checks it.
pub struct ProfileBuilder {
    name: String,
    inputs: Vec<KeyId>,
    prepares: Vec<Box<dyn Prepare>>,
    filters: Vec<Box<dyn Filter>>,
    scorers: Vec<(Box<dyn Scorer>, f64)>,
    picker: Option<Box<dyn Picker>>,
}

impl fmt::Debug for ProfileBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProfileBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ProfileBuilder {
    /// Declares a key the caller sets on every request.
    pub fn input(mut self, key: KeyId) -> Self {
        self.inputs.push(key);
        self
    }

    /// Adds a prepare plugin.
    pub fn prepare(mut self, p: impl Prepare + 'static) -> Self {
        self.prepares.push(Box::new(p));
        self
    }

    /// Adds a boxed prepare plugin.
    pub fn prepare_boxed(mut self, p: Box<dyn Prepare>) -> Self {
        self.prepares.push(p);
        self
    }

    /// Adds a filter.
    pub fn filter(mut self, f: impl Filter + 'static) -> Self {
        self.filters.push(Box::new(f));
        self
    }

    /// Adds a boxed filter.
    pub fn filter_boxed(mut self, f: Box<dyn Filter>) -> Self {
        self.filters.push(f);
        self
    }

    /// Adds a scorer with its weight.
    pub fn scorer(mut self, s: impl Scorer + 'static, weight: f64) -> Self {
        self.scorers.push((Box::new(s), weight));
        self
    }

    /// Adds a boxed scorer with its weight.
    pub fn scorer_boxed(mut self, s: Box<dyn Scorer>, weight: f64) -> Self {
        self.scorers.push((s, weight));
        self
    }

    /// Sets the picker.
    pub fn picker(mut self, p: impl Picker + 'static) -> Self {
        self.picker = Some(Box::new(p));
        self
    }

    /// Sets a boxed picker.
    pub fn picker_boxed(mut self, p: Box<dyn Picker>) -> Self {
        self.picker = Some(p);
        self
    }

    /// Checks the composition: unique names, finite non-negative weights, a
    /// picker, and a producer (an earlier plugin or a declared input) for
    /// every key a plugin needs.
    pub fn build(self) -> Result<Profile, Error> {
        let profile = self.name.clone();
        let Some(picker) = self.picker else {
            return Err(Error::NoPicker { profile });
        };
        for (s, w) in &self.scorers {
            if !w.is_finite() || *w < 0.0 {
                return Err(Error::InvalidWeight {
                    profile,
                    plugin: s.name().to_owned(),
                    weight: *w,
                });
            }
        }
        let mut order: Vec<&dyn Plugin> = Vec::new();
        order.extend(self.prepares.iter().map(|p| p.as_ref() as &dyn Plugin));
        order.extend(self.filters.iter().map(|p| p.as_ref() as &dyn Plugin));
        order.extend(self.scorers.iter().map(|(p, _)| p.as_ref() as &dyn Plugin));
        order.push(picker.as_ref());
        let mut names = HashSet::new();
        let mut available: HashSet<KeyId> = self.inputs.iter().copied().collect();
        for p in &order {
            if !names.insert(p.name().to_owned()) {
                return Err(Error::DuplicateName {
                    profile,
                    plugin: p.name().to_owned(),
                });
            }
            for need in p.needs() {
                if !available.contains(&need) {
                    return Err(Error::MissingProducer {
                        profile,
                        plugin: p.name().to_owned(),
                        key: need.name(),
                    });
                }
            }
            available.extend(p.produces());
        }
        drop(order);
        Ok(Profile {
            name: self.name,
            prepares: self.prepares,
            filters: self.filters,
            scorers: self.scorers,
            picker,
        })
    }
}
