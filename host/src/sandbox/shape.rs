//! What a component is made of, counted before it is compiled.
//!
//! Compiling is the one thing a hostile upload makes the host do before any
//! job limit applies: a small file of many tiny functions costs seconds of
//! CPU and hundreds of MiB. So the bytes are walked once (no validation,
//! no code generation) and a component over any of [`ComponentLimits`] is
//! refused with a message naming the count and the cap. The same caps size
//! the pooling allocator, so a component that passes here also fits a slot.

use serde::Serialize;
use wasmparser::{Parser, Payload};

/// Caps on what one component may contain. Defaults fit real components
/// with room to spare: a componentize-py 0.25 hello has 13,356 functions,
/// 2,302 imports, 14 core modules and 65 core instances; a componentize-js
/// 0.23 one 12,707 functions, 4 modules and 27 instances; a Rust one a few
/// hundred functions and 1–3 instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ComponentLimits {
    /// Size of the component file.
    pub max_bytes: usize,
    /// Functions defined in all its core modules together.
    pub max_functions: u32,
    /// Type definitions (core and component) together.
    pub max_types: u32,
    /// Imports (core and component) together.
    pub max_imports: u32,
    /// Core modules it embeds.
    pub max_core_modules: u32,
    /// Core instances it creates.
    pub max_core_instances: u32,
    /// Linear memories its modules define.
    pub max_memories: u32,
    /// Tables its modules define.
    pub max_tables: u32,
}

/// Default cap on a component's size.
pub const DEFAULT_MAX_COMPONENT_BYTES: usize = 50 << 20;

impl Default for ComponentLimits {
    fn default() -> Self {
        ComponentLimits {
            max_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            max_functions: 60_000,
            max_types: 100_000,
            max_imports: 20_000,
            max_core_modules: 100,
            max_core_instances: 200,
            max_memories: 8,
            max_tables: 64,
        }
    }
}

/// What a component declares it asks for outside its sandbox: its
/// `leash:requests` custom section (at any depth: a Rust guest's sits in
/// its core module), if it has one. `Err`: the bytes are not well-formed,
/// the section is there twice, or it does not parse.
pub fn declared_requests(bytes: &[u8]) -> Result<Option<crate::job::grant::Requests>, String> {
    use crate::job::grant::Requests;
    let mut found = None;
    for payload in Parser::new(0).parse_all(bytes) {
        if let Payload::CustomSection(section) = payload.map_err(|e| e.to_string())?
            && section.name() == Requests::SECTION
        {
            if found.is_some() {
                return Err(format!("the component has more than one {} section", Requests::SECTION));
            }
            found = Some(Requests::parse(section.data())?);
        }
    }
    Ok(found)
}

/// The counts [`ComponentLimits`] caps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) functions: u32,
    pub(crate) types: u32,
    pub(crate) imports: u32,
    pub(crate) core_modules: u32,
    pub(crate) core_instances: u32,
    pub(crate) memories: u32,
    pub(crate) tables: u32,
}

impl Shape {
    /// Count what `bytes` contains. `Err` carries the parser's complaint:
    /// the bytes are not well-formed WebAssembly.
    pub(crate) fn of(bytes: &[u8]) -> Result<Shape, String> {
        let mut shape = Shape::default();
        for payload in Parser::new(0).parse_all(bytes) {
            let add = |n: &mut u32, k: u32| *n = n.saturating_add(k);
            match payload.map_err(|e| e.to_string())? {
                Payload::FunctionSection(s) => add(&mut shape.functions, s.count()),
                Payload::TypeSection(s) => add(&mut shape.types, s.count()),
                Payload::CoreTypeSection(s) => add(&mut shape.types, s.count()),
                Payload::ComponentTypeSection(s) => add(&mut shape.types, s.count()),
                Payload::ImportSection(s) => add(&mut shape.imports, s.count()),
                Payload::ComponentImportSection(s) => add(&mut shape.imports, s.count()),
                Payload::ModuleSection { .. } => add(&mut shape.core_modules, 1),
                Payload::InstanceSection(s) => add(&mut shape.core_instances, s.count()),
                Payload::MemorySection(s) => add(&mut shape.memories, s.count()),
                Payload::TableSection(s) => add(&mut shape.tables, s.count()),
                _ => {}
            }
        }
        Ok(shape)
    }

    /// The first count over its cap, as a sentence.
    pub(crate) fn check(&self, limits: &ComponentLimits) -> Result<(), String> {
        let counts = [
            ("functions", self.functions, limits.max_functions),
            ("type definitions", self.types, limits.max_types),
            ("imports", self.imports, limits.max_imports),
            ("core modules", self.core_modules, limits.max_core_modules),
            ("core instances", self.core_instances, limits.max_core_instances),
            ("memories", self.memories, limits.max_memories),
            ("tables", self.tables, limits.max_tables),
        ];
        match counts.into_iter().find(|(_, n, max)| n > max) {
            Some((what, n, max)) => Err(format!("the component has {n} {what}; leash accepts at most {max}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component_with_functions(n: usize) -> Vec<u8> {
        let funcs = "(func)".repeat(n);
        wat::parse_str(format!("(component (core module {funcs}) (core module (memory 1) (table 1 funcref)))")).unwrap()
    }

    #[test]
    fn counts_what_nested_modules_define() {
        let shape = Shape::of(&component_with_functions(3)).unwrap();
        assert_eq!((shape.functions, shape.core_modules, shape.memories, shape.tables), (3, 2, 1, 1));
        assert_eq!(shape.core_instances, 0);
    }

    #[test]
    fn a_count_over_its_cap_is_named() {
        let limits = ComponentLimits { max_functions: 2, ..ComponentLimits::default() };
        let shape = Shape::of(&component_with_functions(3)).unwrap();
        assert_eq!(shape.check(&limits).unwrap_err(), "the component has 3 functions; leash accepts at most 2");
        assert!(Shape::of(&component_with_functions(2)).unwrap().check(&limits).is_ok());
    }
}
