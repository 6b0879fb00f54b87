(* A generational genetic algorithm over any problem: tournament selection, crossover,
   mutation, and elitism (the best individuals survive unchanged). Lower fitness is
   better. *)

module type PROBLEM = sig
  type genome
  val name : string
  val random : Rng.t -> genome
  val crossover : Rng.t -> genome -> genome -> genome
  val mutate : Rng.t -> genome -> genome
  val fitness : genome -> float
end

type params = { pop : int; generations : int; tournament : int; elite : int }

module Make (P : PROBLEM) = struct
  type ind = { g : P.genome; fit : float }

  let eval g = { g; fit = P.fitness g }
  let better a b = a.fit < b.fit

  let select rng (pop : ind array) k =
    let best = ref pop.(Rng.int rng (Array.length pop)) in
    for _ = 2 to k do
      let c = pop.(Rng.int rng (Array.length pop)) in
      if better c !best then best := c
    done;
    !best

  let sort_pop pop = Array.stable_sort (fun a b -> Float.compare a.fit b.fit) pop

  (* returns the best individual and the mean fitness of the last generation *)
  let run rng prm =
    let pop = Array.init prm.pop (fun _ -> eval (P.random rng)) in
    sort_pop pop;
    let pop = ref pop in
    for _ = 1 to prm.generations do
      let cur = !pop in
      let next =
        Array.init prm.pop (fun i ->
            if i < prm.elite then cur.(i)
            else begin
              let a = select rng cur prm.tournament and b = select rng cur prm.tournament in
              eval (P.mutate rng (P.crossover rng a.g b.g))
            end)
      in
      sort_pop next;
      pop := next
    done;
    let final = !pop in
    let mean = Array.fold_left (fun s i -> s +. i.fit) 0. final /. float (Array.length final) in
    (final.(0), mean)
end
