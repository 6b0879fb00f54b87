(* Variables and constraints of the DeltaBlue solver, with the per-kind methods
   (choosing a direction, recomputing walk strengths, executing). *)

type direction = Forward | Backward | Undirected

type var = {
  name : string;
  mutable value : int;
  mutable constraints : c list;
  mutable determined_by : c option;
  mutable mark : int;
  mutable walk : Strength.t;
  mutable stay : bool;
}

and kind =
  | Stay of var
  | Edit of var
  | Equal of var * var
  | Scale of { src : var; scale : var; offset : var; dst : var }

and c = { kind : kind; strength : Strength.t; mutable satisfied : bool; mutable dir : direction }

let var name value =
  { name; value; constraints = []; determined_by = None; mark = 0; walk = Strength.Weakest; stay = true }

let is_input c = match c.kind with Edit _ -> true | _ -> false
let is_satisfied c = match c.kind with Stay _ | Edit _ -> c.satisfied | Equal _ | Scale _ -> c.dir <> Undirected

let ends c = match c.kind with
  | Stay v | Edit v -> (v, v)
  | Equal (a, b) -> (a, b)
  | Scale s -> (s.src, s.dst)

let output c = match c.kind with
  | Stay v | Edit v -> v
  | _ -> let a, b = ends c in if c.dir = Backward then a else b

let input c = let a, b = ends c in if c.dir = Backward then b else a

let vars c = match c.kind with
  | Stay v | Edit v -> [ v ]
  | Equal (a, b) -> [ a; b ]
  | Scale s -> [ s.src; s.scale; s.offset; s.dst ]

let attach c = List.iter (fun v -> v.constraints <- c :: v.constraints) (vars c)
let detach c = List.iter (fun v -> v.constraints <- List.filter (fun d -> d != c) v.constraints) (vars c)

let mark_unsatisfied c = match c.kind with
  | Stay _ | Edit _ -> c.satisfied <- false
  | _ -> c.dir <- Undirected

let choose_method c mark =
  match c.kind with
  | Stay v | Edit v -> c.satisfied <- v.mark <> mark && Strength.stronger c.strength v.walk
  | _ ->
      let a, b = ends c in
      let can v = v.mark <> mark && Strength.stronger c.strength v.walk in
      c.dir <-
        (if a.mark = mark then (if can b then Forward else Undirected)
         else if b.mark = mark then (if can a then Backward else Undirected)
         else if Strength.weaker a.walk b.walk then (if can a then Backward else Undirected)
         else if can b then Forward
         else Undirected)

let mark_inputs c mark = match c.kind with
  | Stay _ | Edit _ -> ()
  | Equal _ -> (input c).mark <- mark
  | Scale s -> (input c).mark <- mark; s.scale.mark <- mark; s.offset.mark <- mark

let inputs_known c mark = match c.kind with
  | Stay _ | Edit _ -> true
  | _ -> let i = input c in i.mark = mark || i.stay || i.determined_by = None

let execute c = match c.kind with
  | Stay _ | Edit _ -> ()
  | Equal _ -> (output c).value <- (input c).value
  | Scale s ->
      if c.dir = Forward then s.dst.value <- (s.src.value * s.scale.value) + s.offset.value
      else s.src.value <- (s.dst.value - s.offset.value) / s.scale.value

let recalculate c =
  match c.kind with
  | Stay v | Edit v ->
      v.walk <- c.strength;
      v.stay <- not (is_input c)
  | _ ->
      let i = input c and o = output c in
      o.walk <- Strength.weakest c.strength i.walk;
      o.stay <- (i.stay && match c.kind with Scale s -> s.scale.stay && s.offset.stay | _ -> true);
      if o.stay then execute c
