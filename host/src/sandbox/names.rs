//! Function names a component carries compressed, for backtraces.
//!
//! A Rust guest's `name` section (mangled names, one per function) is a
//! seventh of a small component, kept only so a trap's backtrace can name
//! the guest's frames. [`shrink`] (`leash plugins shrink`) moves every core
//! module's function and module names into one deflated custom section,
//! `leash:names`, at the end of the component, and drops the name sections
//! and the component's own `component-name` section (names of component
//! items, which no backtrace shows). The file gets smaller; the backtraces
//! stay the same: [`Names`] reads the section when the component is
//! loaded, and a frame whose module has no names of its own is named from
//! it: the module by where the frame is in the file (wasmtime's frames give
//! that offset, the same on either compiler tier), the function by its
//! index.
//!
//! Nested components are copied as they are (their modules keep their
//! names): a Rust or JavaScript guest has none; a componentize-py 0.25 one
//! has one, beside its 14 top-level core modules.

use wasmparser::{BinaryReader, Name, NameSectionReader};

/// The custom section's name.
pub const SECTION: &str = "leash:names";

/// The section's format: one byte, then a deflated body.
const FORMAT: u8 = 1;

/// Most bytes a section may unpack to (a componentize-py guest's names
/// are ~0.4 MB): a deflate bomb is refused, not unpacked.
const MAX_UNPACKED_BYTES: usize = 16 << 20;

/// The header of a component (magic, version 0x0d, layer 1).
const COMPONENT_HEADER: [u8; 8] = [0, b'a', b's', b'm', 0x0d, 0, 1, 0];

/// Section ids used here.
const CUSTOM: u8 = 0;
const CORE_MODULE: u8 = 1;

/// Names read from a component's `leash:names` section.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// Its core modules, in the order (and at the offsets) of the file.
    modules: Vec<ModuleNames>,
}

/// One core module's names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ModuleNames {
    /// Where the module's bytes start and end in the file.
    start: u32,
    end: u32,
    /// Its name (empty: none).
    name: String,
    /// Its functions' names (demangled), by function index, ascending.
    functions: Vec<(u32, String)>,
}

impl Names {
    /// The names in `component`'s `leash:names` section: `None` when it
    /// has none. `Err` says what is wrong with a section that is there.
    pub fn read(component: &[u8]) -> Result<Option<Names>, String> {
        let mut found = None;
        for section in Sections::after_header(component) {
            let section = section?;
            if section.id == CUSTOM && section.custom_name(component)? == SECTION {
                if found.is_some() {
                    return Err(format!("it has two `{SECTION}` sections"));
                }
                found = Some(section.custom_body(component)?);
            }
        }
        found.map(|body| Names::decode(body).map_err(|e| format!("its `{SECTION}` section {e}"))).transpose()
    }

    /// The module whose bytes hold `offset` of the file (a frame's module
    /// offset).
    pub fn module_at(&self, offset: usize) -> Option<&ModuleNames> {
        let offset = u32::try_from(offset).ok()?;
        let i = self.modules.partition_point(|m| m.start <= offset).checked_sub(1)?;
        Some(&self.modules[i]).filter(|m| offset < m.end)
    }

    fn decode(body: &[u8]) -> Result<Names, String> {
        let (&format, packed) = body.split_first().ok_or("is empty")?;
        if format != FORMAT {
            return Err(format!("is in format {format}; this leash reads format {FORMAT}"));
        }
        let plain = miniz_oxide::inflate::decompress_to_vec_with_limit(packed, MAX_UNPACKED_BYTES)
            .map_err(|e| format!("does not unpack (at most {MAX_UNPACKED_BYTES} bytes): {e}"))?;
        let bad = |e: wasmparser::BinaryReaderError| format!("is damaged: {}", e.message());
        let mut reader = BinaryReader::new(&plain, 0);
        let mut modules: Vec<ModuleNames> = Vec::new();
        for _ in 0..reader.read_var_u32().map_err(bad)? {
            let start = reader.read_var_u32().map_err(bad)?;
            let len = reader.read_var_u32().map_err(bad)?;
            let end = start.checked_add(len).ok_or("is damaged: a module past 4 GiB")?;
            if modules.last().is_some_and(|m| m.end > start) {
                return Err("is damaged: its modules overlap or are out of order".into());
            }
            let name = reader.read_string().map_err(bad)?.to_owned();
            let mut functions = Vec::new();
            let mut index = 0u32;
            for i in 0..reader.read_var_u32().map_err(bad)? {
                let step = reader.read_var_u32().map_err(bad)?;
                if i > 0 && step == 0 {
                    return Err("is damaged: a function named twice".into());
                }
                index = index.checked_add(step).ok_or("is damaged: a function index past 2^32")?;
                functions.push((index, reader.read_string().map_err(bad)?.to_owned()));
            }
            modules.push(ModuleNames { start, end, name, functions });
        }
        if !reader.eof() {
            return Err("is damaged: bytes after its last name".into());
        }
        Ok(Names { modules })
    }

    fn encode(&self) -> Vec<u8> {
        let mut plain = Vec::new();
        leb(&mut plain, self.modules.len());
        for module in &self.modules {
            leb(&mut plain, module.start as usize);
            leb(&mut plain, (module.end - module.start) as usize);
            string(&mut plain, &module.name);
            leb(&mut plain, module.functions.len());
            let mut previous = 0;
            for (index, name) in &module.functions {
                leb(&mut plain, (index - previous) as usize);
                string(&mut plain, name);
                previous = *index;
            }
        }
        let mut body = vec![FORMAT];
        body.extend(miniz_oxide::deflate::compress_to_vec(&plain, 10));
        body
    }

    fn functions(&self) -> usize {
        self.modules.iter().map(|m| m.functions.len()).sum()
    }
}

impl ModuleNames {
    /// The module's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        Some(self.name.as_str()).filter(|n| !n.is_empty())
    }

    /// The name of its function `index` (a frame's function index).
    pub fn function(&self, index: u32) -> Option<&str> {
        let i = self.functions.binary_search_by_key(&index, |(i, _)| *i).ok()?;
        Some(&self.functions[i].1)
    }
}

/// What [`shrink`] made.
#[derive(Debug)]
pub struct Shrunk {
    /// The component, its names in one `leash:names` section.
    pub bytes: Vec<u8>,
    /// Bytes of the name sections it had (with their headers).
    pub names_before: usize,
    /// Bytes of the `leash:names` section that replaced them.
    pub names_after: usize,
    /// Functions it names.
    pub functions: usize,
}

/// `component` with its top-level core modules' `name` sections and its
/// `component-name` section replaced by one compressed `leash:names`
/// section, which leash reads to name backtrace frames. Code, data and
/// every other section are kept byte for byte.
pub fn shrink(component: &[u8]) -> Result<Shrunk, String> {
    if component.get(..8) != Some(&COMPONENT_HEADER[..]) {
        return Err("not a WebAssembly component (it does not start with a component's header)".into());
    }
    let mut out = COMPONENT_HEADER.to_vec();
    let mut names_before = 0;
    let mut names = Names::default();
    for section in Sections::after_header(component) {
        let section = section?;
        if section.id == CUSTOM {
            match section.custom_name(component)? {
                SECTION => return Err("it is shrunk already (it has a `leash:names` section)".into()),
                "component-name" => {
                    names_before += section.whole.len();
                    continue;
                }
                _ => {}
            }
        }
        if section.id != CORE_MODULE {
            out.extend_from_slice(&component[section.whole.clone()]);
            continue;
        }
        let module = &component[section.body.clone()];
        let mut rewritten = module.get(..8).ok_or("a core module is cut short")?.to_vec();
        let (mut name, mut functions) = (String::new(), Vec::new());
        for inner in Sections::after_header_at(module, section.body.start) {
            let inner = inner?;
            let local = inner.whole.start - section.body.start..inner.whole.end - section.body.start;
            if inner.id == CUSTOM && inner.custom_name(component)? == "name" {
                names_before += inner.whole.len();
                (name, functions) = read_name_section(inner.custom_body(component)?, inner.body.start)?;
            } else {
                rewritten.extend_from_slice(&module[local]);
            }
        }
        out.push(CORE_MODULE);
        leb(&mut out, rewritten.len());
        // Where the module is in the file it becomes: what frames report.
        let start = offset(out.len())?;
        out.extend(rewritten);
        names.modules.push(ModuleNames { start, end: offset(out.len())?, name, functions });
    }
    if names_before == 0 {
        return Err("it has no name sections to move".into());
    }
    let body = names.encode();
    let mut section = Vec::new();
    string(&mut section, SECTION);
    section.extend(body);
    let kept = out.len();
    out.push(CUSTOM);
    leb(&mut out, section.len());
    out.extend(section);
    let names_after = out.len() - kept;
    Ok(Shrunk { bytes: out, names_before, names_after, functions: names.functions() })
}

/// The module name and function names (demangled, by index ascending) of
/// a `name` section.
fn read_name_section(body: &[u8], offset: usize) -> Result<(String, Vec<(u32, String)>), String> {
    let bad = |e: wasmparser::BinaryReaderError| format!("a core module's name section is damaged: {}", e.message());
    let mut module = String::new();
    let mut functions = Vec::new();
    for subsection in NameSectionReader::new(BinaryReader::new(body, offset)) {
        match subsection.map_err(bad)? {
            Name::Module { name, .. } => module = name.to_owned(),
            Name::Function(map) => {
                for naming in map {
                    let naming = naming.map_err(bad)?;
                    functions.push((naming.index, format!("{:#}", rustc_demangle::demangle(naming.name))));
                }
            }
            _ => {}
        }
    }
    functions.sort_unstable_by_key(|(index, _)| *index);
    functions.dedup_by_key(|(index, _)| *index);
    Ok((module, functions))
}

fn offset(at: usize) -> Result<u32, String> {
    u32::try_from(at).map_err(|_| "the component is over 4 GiB".to_owned())
}

/// One section of a module or component: its id, its whole bytes (id and
/// size too) and its body, as offsets into the file.
struct Section {
    id: u8,
    whole: std::ops::Range<usize>,
    body: std::ops::Range<usize>,
}

impl Section {
    fn custom_name<'a>(&self, file: &'a [u8]) -> Result<&'a str, String> {
        BinaryReader::new(&file[self.body.clone()], self.body.start)
            .read_string()
            .map_err(|e| format!("a custom section's name is damaged: {}", e.message()))
    }

    fn custom_body<'a>(&self, file: &'a [u8]) -> Result<&'a [u8], String> {
        let mut reader = BinaryReader::new(&file[self.body.clone()], self.body.start);
        reader.read_string().map_err(|e| format!("a custom section's name is damaged: {}", e.message()))?;
        Ok(&file[reader.original_position()..self.body.end])
    }
}

/// The sections of a module or component, after its 8-byte header.
struct Sections<'a> {
    reader: BinaryReader<'a>,
    failed: bool,
}

impl<'a> Sections<'a> {
    fn after_header(file: &'a [u8]) -> Sections<'a> {
        Sections::after_header_at(file, 0)
    }

    /// `bytes` start at `offset` of the file; offsets are the file's.
    fn after_header_at(bytes: &'a [u8], offset: usize) -> Sections<'a> {
        let rest = bytes.get(8..).unwrap_or_default();
        Sections { reader: BinaryReader::new(rest, offset + 8), failed: false }
    }
}

impl Iterator for Sections<'_> {
    type Item = Result<Section, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.reader.eof() {
            return None;
        }
        let start = self.reader.original_position();
        let read = (|| {
            let id = self.reader.read_u8()?;
            let len = self.reader.read_var_u32()? as usize;
            let body_start = self.reader.original_position();
            self.reader.read_bytes(len)?;
            Ok(Section { id, whole: start..body_start + len, body: body_start..body_start + len })
        })();
        self.failed = read.is_err();
        Some(read.map_err(|e: wasmparser::BinaryReaderError| format!("a section is cut short: {}", e.message())))
    }
}

fn leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    leb(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        let module = |start, end, name: &str, functions: &[(u32, &str)]| ModuleNames {
            start,
            end,
            name: name.into(),
            functions: functions.iter().map(|(i, n)| (*i, n.to_string())).collect(),
        };
        Names {
            modules: vec![
                module(10, 400, "a.wasm", &[(3, "a::run"), (7, "a::helper")]),
                module(500, 600, "", &[(0, "shim")]),
            ],
        }
    }

    fn section_of(names: &Names) -> Vec<u8> {
        let mut component = COMPONENT_HEADER.to_vec();
        let mut body = Vec::new();
        string(&mut body, SECTION);
        body.extend(names.encode());
        component.push(CUSTOM);
        leb(&mut component, body.len());
        component.extend(body);
        component
    }

    #[test]
    fn names_read_back_as_written_and_name_frames_by_module_offset_and_index() {
        let read = Names::read(&section_of(&names())).unwrap().unwrap();
        assert_eq!(read, names());
        let a = read.module_at(95).unwrap();
        assert_eq!((a.name(), a.function(7), a.function(4)), (Some("a.wasm"), Some("a::helper"), None));
        let shim = read.module_at(599).unwrap();
        assert_eq!((shim.name(), shim.function(0)), (None, Some("shim")));
        assert!(read.module_at(5).is_none(), "before the first module");
        assert!(read.module_at(450).is_none(), "between modules");
        assert!(read.module_at(600).is_none(), "past the last module");
    }

    #[test]
    fn a_component_without_the_section_has_no_names() {
        assert_eq!(Names::read(&COMPONENT_HEADER), Ok(None));
    }

    #[test]
    fn a_damaged_section_is_an_error_that_says_what_is_wrong() {
        let mut component = section_of(&names());
        let last = component.len() - 3;
        component[last] ^= 0xff;
        let err = Names::read(&component).unwrap_err();
        assert!(err.contains("`leash:names` section"), "{err}");

        let twice = [section_of(&names()), section_of(&names())[8..].to_vec()].concat();
        assert!(Names::read(&twice).unwrap_err().contains("two"));

        let mut newer = section_of(&names());
        let format_at = 8 + 2 + 1 + SECTION.len();
        newer[format_at] = 9;
        assert!(Names::read(&newer).unwrap_err().contains("format 9"), "{:?}", Names::read(&newer));
    }

    #[test]
    fn a_deflate_bomb_is_refused_not_unpacked() {
        let huge = vec![0u8; MAX_UNPACKED_BYTES + 1];
        let mut body = vec![FORMAT];
        body.extend(miniz_oxide::deflate::compress_to_vec(&huge, 10));
        let err = Names::decode(&body).unwrap_err();
        assert!(err.contains("does not unpack"), "{err}");
    }

    #[test]
    fn only_components_are_shrunk() {
        let module = [0, b'a', b's', b'm', 1, 0, 0, 0];
        assert!(shrink(&module).unwrap_err().contains("not a WebAssembly component"));
        assert!(shrink(&COMPONENT_HEADER).unwrap_err().contains("no name sections"));
        assert!(shrink(&section_of(&names())).unwrap_err().contains("shrunk already"));
    }
}
